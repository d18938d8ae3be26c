package test

import (
	"strings"
	"testing"
)

// memcaslapOut is memcaslap's output of a run (libmemcached-tools 1.1),
// its figures to be replaced by the cases.
const memcaslapOut = `servers: 198.18.200.2:11290
threads count: 1
concurrency: 16
run time: 4s
windows size: 10k
set proportion: set_prop=0.10
get proportion: get_prop=0.90
cmd_get: 591063
cmd_set: 65682
get_misses: MISSES
verify_misses: 0
verify_failed: FAILED
written_bytes: 113951900
read_bytes: 651542196
object_bytes: 71462016

Run time: 4.0s Ops: 656745 TPS: 164144 Net_rate: 182.5M/s
`

func TestParseMemcaslap(t *testing.T) {
	out := func(misses, failed string) string {
		return strings.NewReplacer("MISSES", misses, "FAILED", failed).Replace(memcaslapOut)
	}
	v, err := ParseMemcaslap(out("0", "0"))
	if err != nil || v != 656745/4.0 {
		t.Errorf("a clean run: %v, %v; want %v operations a second", v, err, 656745/4.0)
	}
	for _, c := range []struct{ name, out, want string }{
		{"a get missed", out("4566", "0"), "4566 gets missed"},
		{"a value was wrong", out("0", "3"), "3 values were not what was set"},
		{"no figures", "memcaslap: cannot connect\n", "no figures"},
		{"no operations", strings.Replace(out("0", "0"), "Ops: 656745", "Ops: 0", 1), "did nothing"},
	} {
		if _, err := ParseMemcaslap(c.out); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error saying %q", c.name, err, c.want)
		}
	}
}
