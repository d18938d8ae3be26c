package sockets

import "testing"

// TestParsePortList reads the kernel's ip_local_reserved_ports as the
// kernel writes it, and passes over what it cannot read.
func TestParsePortList(t *testing.T) {
	for _, c := range []struct {
		list     string
		in, out  []uint16
		noneKept bool
	}{
		{list: "", noneKept: true},
		{list: "8080", in: []uint16{8080}, out: []uint16{8079, 8081}},
		{list: "8080,9000-9100", in: []uint16{8080, 9000, 9050, 9100}, out: []uint16{8999, 9101, 1}},
		{list: " 40000-40002 , 50000", in: []uint16{40000, 40002, 50000}, out: []uint16{40003}},
		{list: "x,70000,5-3,7", in: []uint16{7}, out: []uint16{3, 4, 5, 0}},
		{list: "junk", noneKept: true},
	} {
		f := parsePortList(c.list)
		if c.noneKept {
			if f != nil {
				t.Errorf("%q: a test of membership, want none", c.list)
			}
			continue
		}
		for _, p := range c.in {
			if !f(p) {
				t.Errorf("%q: port %d not in it", c.list, p)
			}
		}
		for _, p := range c.out {
			if f(p) {
				t.Errorf("%q: port %d in it", c.list, p)
			}
		}
	}
}
