package timers

import "unsafe"

func unsafeBytes(u []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&u[0])), len(u)*8)
}
