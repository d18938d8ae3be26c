package test

import (
	"fmt"
	"regexp"
	"strconv"
)

var (
	memcaslapOps    = regexp.MustCompile(`(?m)^Run time: ([0-9.]+)s Ops: (\d+) TPS`)
	memcaslapMisses = regexp.MustCompile(`(?m)^get_misses: (\d+)`)
	memcaslapFailed = regexp.MustCompile(`(?m)^verify_failed: (\d+)`)
)

// ParseMemcaslap reads memcaslap's output: operations a second (its last
// "Run time" line, the whole run's), or an error if a get missed or a
// checked value was not what was set.
func ParseMemcaslap(out string) (float64, error) {
	m := memcaslapOps.FindAllStringSubmatch(out, -1)
	miss, failed := memcaslapMisses.FindStringSubmatch(out), memcaslapFailed.FindStringSubmatch(out)
	if m == nil || miss == nil || failed == nil {
		return 0, fmt.Errorf("memcaslap printed no figures:\n%s", out)
	}
	if miss[1] != "0" || failed[1] != "0" {
		return 0, fmt.Errorf("memcaslap: %s gets missed and %s values were not what was set:\n%s", miss[1], failed[1], out)
	}
	last := m[len(m)-1]
	secs, _ := strconv.ParseFloat(last[1], 64)
	ops, _ := strconv.ParseFloat(last[2], 64)
	if secs <= 0 || ops == 0 {
		return 0, fmt.Errorf("memcaslap did nothing:\n%s", out)
	}
	return ops / secs, nil
}
