//go:build !amd64 && !arm64

package xdp

import "sync/atomic"

func storeRelease(addr *uint32, v uint32) { atomic.StoreUint32(addr, v) }
