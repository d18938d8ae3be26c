package stack

import "fmt"

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
	return fmt.Sprintf("tcp %s %v -> %v flags %#x err %d snd una=%d nxt=%d max=%d wnd=%d cwnd=%d ssthresh=%d queued=%dB rcv nxt=%d adv=%d q=%dB/%d ooo=%dB/%d mss=%d ws=%d/%d rto=%dus",
		stateName(sk.state), addrPort(sk.localAddr, sk.localPort), addrPort(sk.remoteAddr, sk.remotePort), sk.tflags, sk.err,
		sk.sndUna-sk.iss, sk.sndNxt-sk.iss, sk.sndMax-sk.iss, sk.sndWnd, sk.cwnd, sk.ssthresh, sk.sndBytes,
		sk.rcvNxt-sk.irs, sk.rcvAdv-sk.irs, sk.rcvBytes, sk.rcvFrames, sk.oooBytes, sk.oooFrames, sk.mss, sk.sndWS, sk.rcvWS, sk.rto)
}
