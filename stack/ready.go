package stack

// The ready log: every poll that may raise a socket's readiness (a
// segment, a timer, a connection on a listener, a datagram, a handover,
// a shutdown: touchLocked) notes the socket's slot in a ring in the
// image, and a caller that watches many sockets for readiness (the
// shim's epoll) reads the ring since it last looked and checks those,
// the ones it found ready last time and the ones waiting for write
// space, instead of every socket it watches, as the kernel's epoll keeps
// a ready list filled by the sockets' wake-ups. The ring is shared by
// every reader and every process on the stack; a reader that falls more
// than its length behind checks everything once.

// readyLogLen is the ring's length: a reader that falls this far behind
// checks all its sockets.
const readyLogLen = 2048

// logReadyLocked notes sk in the ready log. A slot already the log's
// last entry, written since any reader last read, is not written again:
// every reader that has yet to read that entry sees the change anyway.
func (s *Stack) logReadyLocked(sk *sock) {
	if s.readyArmed {
		s.readyArmed = false
		s.readyWake()
	}
	h := s.img.hdr
	slot := s.slotOf(sk)
	if h.readySeq != h.readyRead && h.readyLog[(h.readySeq-1)%readyLogLen] == slot {
		return
	}
	h.readyLog[h.readySeq%readyLogLen] = slot
	h.readySeq++
}

// ReadySince copies into slots the slots the ready log names from *seq
// (a reader's position, from an earlier call; any value the first time)
// to its head, and moves *seq to the head. ok is false when the caller
// must check every socket it watches instead: the log wrapped since *seq
// (or *seq is from elsewhere), or it names more than len(slots). A slot
// may be named more than once, or belong to a socket another process
// holds or one that is gone: the caller maps slots to its own sockets
// (SockID.Slot) and checks their events.
func (s *Stack) ReadySince(seq *uint32, slots []uint32) (n int, ok bool) {
	s.lock()
	defer s.unlock()
	h := s.img.hdr
	head := h.readySeq
	h.readyRead = head
	behind := head - *seq
	*seq = head
	if behind > readyLogLen || int(behind) > len(slots) {
		return 0, false
	}
	for i := range behind {
		slots[i] = h.readyLog[(head-behind+i)%readyLogLen]
	}
	return int(behind), true
}

// ReadyHead is the ready log's head, where a new reader starts after it
// checked every socket it watches.
func (s *Stack) ReadyHead() uint32 {
	s.lock()
	defer s.unlock()
	h := s.img.hdr
	h.readyRead = h.readySeq // what is logged from now on, this reader reads
	return h.readySeq
}

// ArmReady asks for Options.ReadyWake at the ready log's next entry, for a
// caller about to block until any socket it watches may be ready (where
// arming each of many sockets would cost more than a spurious wake-up):
// moved is true, and nothing asked, if the log has moved past seq (the
// caller's position after its last check, from ReadySince or ReadyHead).
// Only this process's polls call ReadyWake: on a stack shared with other
// processes (JoinWakes) ok is false, and the caller arms its sockets
// (WaitForAll).
func (s *Stack) ArmReady(seq uint32) (moved, ok bool) {
	s.lock()
	defer s.unlock()
	if s.proc() != 0 || s.readyWake == nil {
		return false, false
	}
	if s.img.hdr.readySeq != seq {
		return true, true
	}
	s.readyArmed = true
	return false, true
}
