package stack

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/xdp-onload/onload/timers"
	"github.com/xdp-onload/onload/vnic"
)

// DumpSocket describes a socket's state on one line, for diagnostics and
// the stack inspector.
func (s *Stack) DumpSocket(id SockID) string {
	s.lock()
	defer s.unlock()
	idx := id.index()
	if idx >= uint32(len(s.img.socks)) {
		return "no such slot"
	}
	sk := &s.img.socks[idx]
	return s.describeLocked(sk)
}

func (s *Stack) describeLocked(sk *sock) string {
	if sk.kind != kindTCP {
		return fmt.Sprintf("kind %d %v -> %v rcvq %dB/%d", sk.kind, addrPort(sk.localAddr, sk.localPort), addrPort(sk.remoteAddr, sk.remotePort), sk.rcvBytes, sk.rcvFrames)
	}
	wheelAt, armed := s.img.wheel.Deadline(s.sockTimer(sk, timerRTO))
	if !armed {
		wheelAt = 0
	}
	return fmt.Sprintf("tcp %s %v -> %v flags %#x err %d snd una=%d nxt=%d max=%d wnd=%d cwnd=%d ssthresh=%d queued=%dB rcv nxt=%d adv=%d q=%dB/%d ooo=%dB/%d mss=%d ws=%d/%d rto=%dus backoff=%d retries=%d rtoAt=%+d wheel=%+d (ticks from now) mode=%d ca=%s sacked=%d lost=%d rexmit=%d flight=%d rack rtt=%dus minrtt=%dus reo=%dus",
		stateName(sk.state), addrPort(sk.localAddr, sk.localPort), addrPort(sk.remoteAddr, sk.remotePort), sk.tflags, sk.err,
		sk.sndUna-sk.iss, sk.sndNxt-sk.iss, sk.sndMax-sk.iss, sk.sndWnd, sk.cwnd, sk.ssthresh, sk.sndBytes,
		sk.rcvNxt-sk.irs, sk.rcvAdv-sk.irs, sk.rcvBytes, sk.rcvFrames, sk.oooBytes, sk.oooFrames, sk.mss, sk.sndWS, sk.rcvWS, sk.rto,
		sk.backoff, sk.retries, relTick(sk.rtoAt, s.nowTick()), relTick(wheelAt, s.nowTick()),
		sk.timerMode, caStateNames[min(sk.caState, caLoss)], sk.sackedBytes, sk.lostBytes, sk.rexmitBytes, sk.flight(),
		sk.rackRTT, sk.minRTT, sk.reoWnd())
}

func relTick(t, now timers.Tick) int64 {
	if t == 0 {
		return 0
	}
	return int64(t) - int64(now)
}

// Dump describes every socket in use, one per line, with the stack's
// lock word and pool: the stack inspector's view.
func (s *Stack) Dump() string {
	s.lock()
	defer s.unlock()
	return s.dumpLocked()
}

// InspectNIC runs fn on the stack's NIC under the stack lock, for an
// inspector that reads the NIC's counters and rings, which the stack's
// polls write.
func (s *Stack) InspectNIC(fn func(vnic.NIC)) {
	s.lock()
	defer s.unlock()
	fn(s.nic)
}

// TryDump is Dump for an inspector that must never wait on the stack's
// users (onloadd): it takes the lock only if it is free within a few
// milliseconds, and leaves the work others deferred to the holder for the
// next one (it polls nothing: the frames and wake-ups are the users').
// It reports false if the lock stayed held.
func (s *Stack) TryDump() (string, bool) {
	var out string
	ok := s.tryLooking(func() { out = s.dumpLocked() })
	return out, ok
}

// TrySockets is Sockets for an inspector that must never wait (TryDump).
func (s *Stack) TrySockets() ([]SocketRow, bool) {
	var rows []SocketRow
	ok := s.tryLooking(func() { rows = s.socketsLocked() })
	return rows, ok
}

// TryCheck looks over the socket table for what no process writes: a
// slot of no known kind, or a link out of range. Each counts as an
// inconsistency (CorruptSeen). A poll reads only what its frames and
// timers lead to, and a broken or hostile process may have written
// anywhere: onloadd runs this beside its takeover polls. The lock is
// taken as by TrySockets; false if it stayed held.
func (s *Stack) TryCheck() (bad int, ok bool) {
	ok = s.tryLooking(func() {
		n := uint32(len(s.img.socks))
		for i := range s.img.socks {
			if sk := &s.img.socks[i]; sk.kind > kindTCP || (sk.next != noSlot && sk.next >= n) {
				bad++
			}
		}
		s.img.hdr.counters.ImageCorrupt += uint64(bad)
	})
	return bad, ok
}

// TryCounters is Counters for an inspector that must never wait
// (TryDump).
func (s *Stack) TryCounters() (Counters, bool) {
	var c Counters
	ok := s.tryLooking(func() { c = s.img.hdr.counters })
	return c, ok
}

// tryLooking runs look with the lock, if it is free within a few
// milliseconds, and lets it go leaving the work deferred to the holder
// for the next one; false if the lock stayed held.
func (s *Stack) tryLooking(look func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.tryLockWithin(5 * time.Millisecond) {
		return false
	}
	raceAcquire(&s.raceHB)
	look()
	raceRelease(&s.raceHB)
	s.img.hdr.lock.UnlockLeaving()
	return true
}

// tryLockWithin takes the image's lock word by trylock, trying every 50µs
// for at most wait: for a caller that must never wait on a holder that
// may be stopped or dead. The caller holds s.mu.
func (s *Stack) tryLockWithin(wait time.Duration) bool {
	for end := time.Now().Add(wait); !s.img.hdr.lock.TryLock(); {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
	return true
}

func (s *Stack) dumpLocked() string {
	h := s.img.hdr
	out := fmt.Sprintf("stack %v: %d sockets in use, %d frames free, %d in send queues, %d receivers (a window share of %d frames), counters %+v\n",
		netip.AddrFrom4(h.addr), h.sockInUse, s.pool.Available(), h.sndFrames, h.rcvActive, s.rcvShareFrames(), h.counters)
	gw := "none"
	if h.gateway != [4]byte{} {
		gw = netip.AddrFrom4(h.gateway).String()
	}
	out += fmt.Sprintf("  mtu %d gateway %s neighbours:", h.mtu, gw)
	for i := range s.img.neigh {
		if e := &s.img.neigh[i]; e.state != neighFree {
			out += fmt.Sprintf(" %v=%v(%s)", netip.AddrFrom4(e.addr), net.HardwareAddr(e.mac[:]), neighStateNames[e.state&3])
		}
	}
	out += "\n"
	for i := range s.img.socks {
		sk := &s.img.socks[i]
		if sk.kind != kindFree {
			out += fmt.Sprintf("  %v wake=%v %s\n", makeSockID(uint32(i), sk.gen), sk.flags&sfWake != 0 || sk.waiters != 0, s.describeLocked(sk))
		}
	}
	return out
}

var neighStateNames = [4]string{"free", "incomplete", "valid", "failed"}
