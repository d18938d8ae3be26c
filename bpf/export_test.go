package bpf

// PutListenerRaw writes a listener entry with any value, bypassing the
// range check, as a process holding the map's fd could.
func PutListenerRaw(s *Steering, l Listener, value uint32) error {
	k, err := listenerKey(l)
	if err != nil {
		return err
	}
	return s.objs.Listeners.Put(k, value)
}

// LoadSpec is the program's ELF as bpf2go embedded it.
var LoadSpec = loadSteer
