package bpf_test

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xdp-onload/onload/bpf"
)

// TestXSKMapsWithoutBTF: the program's XSKMAPs carry their key and value
// as sizes, not BTF types. The kernel takes no BTF for this map type;
// offered it, cilium/ebpf's loader has the map made, refused and freed,
// then made again without, and the free waits out an RCU grace period:
// 18 ms or so of every stack's start for each map (perf showed
// xsk_map_free under map_create twice), 73-96 ms to the stack against
// 53-63 without.
func TestXSKMapsWithoutBTF(t *testing.T) {
	spec, err := bpf.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, m := range spec.Maps {
		if m.Type != ebpf.XSKMap {
			continue
		}
		n++
		if m.Key != nil || m.Value != nil {
			t.Errorf("XSKMAP %s has BTF types (key %v, value %v): declare it with key_size and value_size", name, m.Key, m.Value)
		}
		if m.KeySize != 4 || m.ValueSize != 4 {
			t.Errorf("XSKMAP %s: key size %d, value size %d, want 4 and 4", name, m.KeySize, m.ValueSize)
		}
	}
	if n == 0 {
		t.Fatal("no XSKMAP in the program")
	}
}
