package ethtool

import (
	"strings"
	"testing"
	"unsafe"
)

func TestBadNames(t *testing.T) {
	if _, err := RxQueues(strings.Repeat("x", 16)); err == nil || !strings.Contains(err.Error(), "longer than 15 bytes") {
		t.Errorf("16-byte name: %v", err)
	}
	if err := DisableTxChecksum("no-such-if0"); err == nil || !strings.Contains(err.Error(), "no-such-if0") {
		t.Errorf("missing interface: %v", err)
	}
}

// TestRuleLayout: the request structs have the kernel's layout (x86-64
// and arm64: struct ethtool_rxnfc is 192 bytes, its flow spec at 16, the
// spec's ring cookie at 152 and location at 160), and a rule's fields
// land where struct ethtool_tcpip4_spec has them.
func TestRuleLayout(t *testing.T) {
	var req rxnfc
	if got := unsafe.Sizeof(req); got != 192 {
		t.Errorf("sizeof ethtool_rxnfc = %d, want 192", got)
	}
	if got := unsafe.Offsetof(req.fs); got != 16 {
		t.Errorf("offsetof fs = %d, want 16", got)
	}
	if got := unsafe.Offsetof(req.fs.ringCookie); got != 152 {
		t.Errorf("offsetof ring_cookie = %d, want 152", got)
	}
	if got := unsafe.Offsetof(req.fs.location); got != 160 {
		t.Errorf("offsetof location = %d, want 160", got)
	}
	fs := Rule{Addr: [4]byte{198, 18, 0, 2}, Port: 0x1234, Queue: 3}.spec()
	if fs.flowType != tcpV4Flow || fs.ringCookie != 3 || fs.location != locAny {
		t.Errorf("spec: flow %#x queue %d location %#x", fs.flowType, fs.ringCookie, fs.location)
	}
	if fs.h[4] != 198 || fs.h[7] != 2 || fs.h[10] != 0x12 || fs.h[11] != 0x34 || fs.m[4] != 0xff || fs.m[10] != 0xff || fs.m[0] != 0 || fs.m[8] != 0 {
		t.Errorf("spec values %x masks %x", fs.h[:13], fs.m[:13])
	}
	if fs := (Rule{UDP: true, Port: 53}).spec(); fs.flowType != udpV4Flow || fs.m[4] != 0 {
		t.Errorf("a UDP rule on any address: flow %#x, address mask %x", fs.flowType, fs.m[4:8])
	}
}
