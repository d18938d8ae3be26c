package interrupts

import (
	"errors"
	"os"
	"sync"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/vnic"
)

// Source is a stack's interrupt line, enabled lazily: armed, it signals
// once on C when a frame arrives for the stack; disarmed, arrivals cost
// nothing. Arm and Disarm are cheap (no system call).
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

// Steering is the interrupt line of an AF_XDP stack: its armed flag in the
// steering program's control array, and the program's wake events, read
// from ev by a goroutine parked in the runtime's network poller. Events
// for other stacks are dropped (a process reading the ring serves one
// stack; onloadd, later, all of them). Close closes ev.
func Steering(ev *bpf.EventReader, ctl bpf.Control, id bpf.StackID) Source {
	s := &steeringSource{ev: ev, ctl: ctl, id: id, c: make(chan struct{}, 1), done: make(chan struct{})}
	go s.read()
	return s
}

type steeringSource struct {
	ev   *bpf.EventReader
	ctl  bpf.Control
	id   bpf.StackID
	c    chan struct{}
	done chan struct{}
	once sync.Once
}

func (s *steeringSource) Arm()               { s.ctl.Arm() }
func (s *steeringSource) Disarm()            { s.ctl.Disarm() }
func (s *steeringSource) C() <-chan struct{} { return s.c }

func (s *steeringSource) read() {
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
				select {
				case s.c <- struct{}{}:
				default:
				}
			}
		}
	}
}

func (s *steeringSource) Close() error {
	var err error
	s.once.Do(func() {
		s.ctl.Disarm()
		err = s.ev.Close()
		<-s.done
	})
	return err
}
