package stack

// Option is a socket option the engine keeps.
type Option int

const (
	NoDelay      Option = iota + 1 // TCP_NODELAY: 0 or 1
	KeepAlive                      // SO_KEEPALIVE: 0 or 1
	KeepIdle                       // TCP_KEEPIDLE, seconds: 1 to 32767
	KeepIntvl                      // TCP_KEEPINTVL, seconds: 1 to 32767
	KeepCount                      // TCP_KEEPCNT: 1 to 127
	Linger                         // SO_LINGER: -1 off, 0 reset on close, >0 seconds
	RecvBuffer                     // SO_RCVBUF, bytes
	SendBuffer                     // SO_SNDBUF, bytes
	ReuseAddr                      // SO_REUSEADDR: 0 or 1
	Congestion                     // TCP_CONGESTION: CongestionCubic or CongestionReno
	UserTimeout                    // TCP_USER_TIMEOUT (RFC 5482), milliseconds: 0 (off) to 2^31-1
	Cork                           // TCP_CORK: 0 or 1
	DeferAccept                    // TCP_DEFER_ACCEPT on a listener, seconds: 0 (off) up; more than maxDeferAccept counts as that
	TOS                            // IP_TOS: 0 to 255; on TCP the two ECN bits are TCP's (RFC 3168 5): 0, as it does not negotiate ECN
	TTL                            // IP_TTL: 1 to 255, or -1 for the default (defaultTTL)
	QuickAck                       // TCP_QUICKACK: 0 delays ACKs for the answer; another value sends an owed ACK now and stops delaying (an even one delays again if it sent one)
	RcvLowat                       // SO_RCVLOWAT, bytes: readable from this many (1 if 0; a negative value is the most); at most half the receive buffer, which grows to twice it unless SO_RCVBUF was set
	NotSentLowat                   // TCP_NOTSENT_LOWAT, bytes (0, the default: the stack's, net.ipv4.tcp_notsent_lowat, which reads back as 0; it is no limit unless set): writable while less than half this is unsent, and a send queues while less than this is
)

// defaultTTL is the IPv4 time to live of a socket that set none: Linux's
// net.ipv4.ip_default_ttl default.
const defaultTTL = 64

// SetOption sets a socket option; a value out of range is ErrInvalid.
func (s *Stack) SetOption(id SockID, opt Option, v int) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	flag := func(f uint32) error {
		if v != 0 && v != 1 {
			return ErrInvalid
		}
		if v == 1 {
			sk.tflags |= f
		} else {
			sk.tflags &^= f
		}
		return nil
	}
	switch opt {
	case NoDelay:
		if err := flag(tfNoDelay); err != nil {
			return err
		}
		if v == 1 && sk.tflags&tfCork != 0 {
			sk.tflags |= tfPush // Linux's TCP_NAGLE_PUSH: what the cork held goes once
		}
		s.pushLocked(sk) // what Nagle held goes now
	case Cork:
		if err := flag(tfCork); err != nil {
			return err
		}
		if v == 0 {
			sk.corkAt = 0
			s.pushLocked(sk) // what the cork held goes now, as Nagle allows
		}
	case DeferAccept:
		if v < 0 {
			return ErrInvalid
		}
		if sk.state == tcpListen || sk.state == tcpClosed {
			sk.deferAccept = uint32(min(v, maxDeferAccept)) // a connection's has no use for it
		}
	case KeepAlive:
		if err := flag(tfKeepAlive); err != nil {
			return err
		}
		s.armKeepaliveLocked(sk)
	case KeepIdle, KeepIntvl:
		if v < 1 || v > 32767 {
			return ErrInvalid
		}
		if opt == KeepIdle {
			sk.keepIdle = uint32(v)
			s.armKeepaliveLocked(sk)
		} else {
			sk.keepIntvl = uint32(v)
		}
	case KeepCount:
		if v < 1 || v > 127 {
			return ErrInvalid
		}
		sk.keepCnt = uint32(v)
	case Linger:
		if v < -1 {
			return ErrInvalid
		}
		if v == 0 {
			sk.tflags |= tfLinger0
		} else {
			sk.tflags &^= tfLinger0
		}
	case RecvBuffer, SendBuffer:
		if v < minBuffer || v > maxBuffer {
			return ErrInvalid
		}
		if opt == RecvBuffer {
			sk.rcvBuf = uint32(v)
			sk.flags |= sfRcvBufSet
		} else {
			sk.sndBuf = uint32(v)
			sk.flags |= sfSndBufSet
		}
	case UserTimeout:
		if v < 0 || v > 1<<31-1 {
			return ErrInvalid
		}
		sk.userTimeout = uint32(v)
	case Congestion:
		if v != CongestionCubic && v != CongestionReno {
			return ErrInvalid
		}
		if int(sk.ccAlgo) != v {
			sk.ccAlgo = uint8(v)
			sk.cubEpoch, sk.cubWMax, sk.abcBytes, sk.cubCarry = 0, 0, 0, 0
		}
	case ReuseAddr:
		return flag(tfReuseAddr)
	case QuickAck:
		s.quickAckLocked(sk, v)
	case RcvLowat:
		s.setRcvLowatLocked(sk, v)
	case NotSentLowat:
		// Linux takes any value (a negative one as unsigned).
		sk.notsentLowat = uint32(v)
		s.touchLocked(sk) // a writer may be ready now
	case TOS, TTL:
		// Linux's do_ip_setsockopt: a TCP socket's TOS leaves the ECN
		// bits to TCP; a TTL of -1 is the default.
		if v < -1 || v > 255 || v == 0 && opt == TTL || v == -1 && opt == TOS {
			return ErrInvalid
		}
		if opt == TOS && sk.kind == kindTCP {
			sk.tos = uint8(v) &^ ecnMask
		} else if opt == TOS {
			sk.tos = uint8(v)
		} else {
			sk.ttl = uint8(max(v, 0)) // 0: the default
		}
		sk.tmplValid = false // the next segment's headers take it
	default:
		return ErrInvalid
	}
	return nil
}

// pushLocked sends what the send queue holds, as far as the windows,
// cork and Nagle allow.
func (s *Stack) pushLocked(sk *sock) {
	if sk.kind == kindTCP {
		s.tcpOutputLocked(sk)
		s.flushLocked()
	}
}

// Option reads a socket option.
func (s *Stack) Option(id SockID, opt Option) (int, error) {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return 0, err
	}
	b := func(f uint32) int {
		if sk.tflags&f != 0 {
			return 1
		}
		return 0
	}
	switch opt {
	case NoDelay:
		return b(tfNoDelay), nil
	case Cork:
		return b(tfCork), nil
	case DeferAccept:
		return int(sk.deferAccept), nil
	case KeepAlive:
		return b(tfKeepAlive), nil
	case KeepIdle:
		return int(sk.keepIdle), nil
	case KeepIntvl:
		return int(sk.keepIntvl), nil
	case KeepCount:
		return int(sk.keepCnt), nil
	case Linger:
		if sk.tflags&tfLinger0 != 0 {
			return 0, nil
		}
		return -1, nil
	case RecvBuffer:
		return int(sk.rcvBuf), nil
	case SendBuffer:
		return int(sk.sndBuf), nil
	case ReuseAddr:
		return b(tfReuseAddr), nil
	case Congestion:
		return int(sk.ccAlgo), nil
	case UserTimeout:
		return int(sk.userTimeout), nil
	case TOS:
		return int(sk.tos), nil
	case TTL:
		return int(sk.ipTTL()), nil
	case QuickAck:
		return 1 - b(tfPingPong), nil
	case RcvLowat:
		return int(max(sk.rcvLowat, 1)), nil
	case NotSentLowat:
		return int(int32(sk.notsentLowat)), nil
	}
	return 0, ErrInvalid
}

// quickAckLocked is TCP_QUICKACK, as Linux's __tcp_sock_set_quickack:
// 0 enters ping-pong mode, where a read leaves its ACK to the answer or
// the delayed-ACK timer (tfPingPong; the first answer sets it anyway);
// any other value leaves it, and sends at once an ACK the connection
// owes (on its delayed-ACK timer, or held for a corked reader's wait),
// after which an even one enters it again. The mode moves by itself after,
// as Linux's does: programs that want every ACK at once set it after
// each read.
func (s *Stack) quickAckLocked(sk *sock, v int) {
	if v == 0 {
		sk.tflags |= tfPingPong
		return
	}
	sk.tflags &^= tfPingPong
	if (sk.state == tcpEstablished || sk.state == tcpCloseWait) &&
		(sk.tflags&tfDelAck != 0 || sk.flags&sfAckHeld != 0) {
		sk.tflags |= tfAckNow
		s.pushLocked(sk)
		if v&1 == 0 {
			sk.tflags |= tfPingPong
		}
	}
}

// setRcvLowatLocked is SO_RCVLOWAT, as Linux's tcp_set_rcvlowat: a
// negative value is the most, the mark is at most half the receive
// buffer (the buffer SO_RCVBUF set, else the largest), and a buffer the
// program did not size grows to twice the mark, so that the mark can be
// met. A reader the new mark satisfies is woken.
func (s *Stack) setRcvLowatLocked(sk *sock, v int) {
	limit := uint32(maxBuffer / 2)
	if sk.flags&sfRcvBufSet != 0 {
		limit = sk.rcvBuf / 2
	}
	m := limit
	if v >= 0 {
		m = uint32(min(int64(v), int64(limit)))
	}
	sk.rcvLowat = m
	if sk.flags&sfRcvBufSet == 0 && 2*m > sk.rcvBuf {
		sk.rcvBuf = 2 * m
	}
	s.touchLocked(sk)
}
