package interrupts

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/vnic"
)

// Source is a stack's interrupt line, enabled lazily: armed, it signals
// once on C when a frame can be received, at once if one can be now;
// disarmed, arrivals cost nothing. Arm makes at most one system call per
// socket of the stack; Disarm none.
type Source interface {
	Arm()
	Disarm()
	C() <-chan struct{}
	Close() error
}

// Mem is the interrupt line of an in-memory NIC.
func Mem(m *vnic.Mem) Source { return memSource{m} }

type memSource struct{ m *vnic.Mem }

func (s memSource) Arm()               { s.m.Arm() }
func (s memSource) Disarm()            { s.m.Disarm() }
func (s memSource) C() <-chan struct{} { return s.m.Interrupts() }
func (s memSource) Close() error       { return nil }

// Steering is the interrupt line of an AF_XDP stack: its armed flag in
// the steering program's control array, and the readiness of its AF_XDP
// sockets (xsks, their file descriptors). Arming sets the flag and asks
// the kernel for one readiness signal; the signal comes when a frame is in
// an RX ring, which the steering program's wake event cannot promise (it
// is posted before the driver flushes the frame into the ring). The flag
// stays, for whoever reads the steering program's wake events: ev, when
// not nil, is that reader (a standalone process owns the program, and
// drains the ring so that it does not fill); its events for other stacks
// are dropped. Close closes ev.
func Steering(ev *bpf.EventReader, ctl bpf.Control, id bpf.StackID, xsks ...int) (Source, error) {
	r, err := newReadiness(xsks)
	if err != nil {
		return nil, err
	}
	s := &steeringSource{ev: ev, ctl: ctl, id: id, r: r, done: make(chan struct{})}
	if ev != nil {
		go s.drain()
	} else {
		close(s.done)
	}
	return s, nil
}

type steeringSource struct {
	ev   *bpf.EventReader
	ctl  bpf.Control
	id   bpf.StackID
	r    *readiness
	done chan struct{}
	once sync.Once

	events atomic.Uint64 // wake events for this stack, drained
}

// Arm sets the armed flag, then enables the readiness signal if an earlier
// arm has not left it enabled. A signal already sent stays: the Sleeper
// wakes, polls, finds nothing perhaps, and sleeps again.
func (s *steeringSource) Arm() {
	s.ctl.Arm()
	s.r.arm()
}

func (s *steeringSource) Disarm()            { s.ctl.Disarm() }
func (s *steeringSource) State() string      { return s.r.state() }
func (s *steeringSource) C() <-chan struct{} { return s.r.C() }
func (s *steeringSource) irqFD() int         { return s.r.irqFD() }
func (s *steeringSource) takeIRQ()           { s.r.takeIRQ() }

// drain reads the wake-event ring so that it never fills; readiness, not
// the events, wakes the stack.
func (s *steeringSource) drain() {
	defer close(s.done)
	for {
		if err := s.ev.Wait(); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			return // closed
		}
		for _, e := range s.ev.TakePending() {
			if e.Stack == s.id {
				s.events.Add(1)
			}
		}
	}
}

func (s *steeringSource) Close() error {
	var err error
	s.once.Do(func() {
		s.ctl.Disarm()
		if s.ev != nil {
			err = s.ev.Close()
		}
		<-s.done
		err = errors.Join(err, s.r.close())
	})
	return err
}

// Readiness is the interrupt line of an AF_XDP stack that has no armed
// flag of its own: only the readiness of its AF_XDP sockets (xsks, their
// file descriptors), which the kernel signals when a frame is in an RX
// ring. A stack onloadd made for this process uses it: the steering
// program is the daemon's.
func Readiness(xsks ...int) (Source, error) {
	r, err := newReadiness(xsks)
	if err != nil {
		return nil, err
	}
	return readinessSource{r}, nil
}

type readinessSource struct{ r *readiness }

func (s readinessSource) Arm()               { s.r.arm() }
func (s readinessSource) Disarm()            {}
func (s readinessSource) State() string      { return s.r.state() }
func (s readinessSource) C() <-chan struct{} { return s.r.C() }
func (s readinessSource) irqFD() int         { return s.r.irqFD() }
func (s readinessSource) takeIRQ()           { s.r.takeIRQ() }
func (s readinessSource) Close() error       { return s.r.close() }
