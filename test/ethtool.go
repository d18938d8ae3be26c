package test

import "github.com/xdp-onload/onload/internal/ethtool"

// disableTxChecksum turns off transmit checksum offload on an interface of
// the calling thread's namespace (ethtool -K name tx off). A veth has no
// hardware to finish checksums the kernel leaves partial, so without this
// the frames an AF_XDP socket on the other end sees carry incomplete TCP
// and UDP checksums. A real NIC fills them in before the wire; turning
// offload off makes the veth behave like a wire.
func disableTxChecksum(name string) error { return ethtool.DisableTxChecksum(name) }
