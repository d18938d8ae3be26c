package vnic

import "unsafe"

// unsafeBytes views a []uint64 as bytes: a way to get 8-byte aligned
// memory from the Go heap for a pool's metadata.
func unsafeBytes(u []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&u[0])), len(u)*8)
}
