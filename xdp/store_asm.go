//go:build amd64 || arm64

package xdp

// storeRelease publishes v at addr after every earlier store, like the
// kernel's smp_store_release: it is how a ring's producer or consumer index
// is handed to the kernel. It is written in assembly because Go's atomic
// store is sequentially consistent, which on amd64 costs a full fence per
// ring update.
//
//go:noescape
func storeRelease(addr *uint32, v uint32)
