// Package xdp is AF_XDP on golang.org/x/sys/unix: the UMEM in a memfd
// (MAP_SHARED, so that another process given the fd maps the same
// frames), the four rings (fill, completion, RX, TX) with cached indices
// and release stores, need-wakeup kicks, XDP_STATISTICS, and attaching
// XDP programs through BPF links (native, falling back to generic).
// Errors name the interface and queue and say what to do.
package xdp
