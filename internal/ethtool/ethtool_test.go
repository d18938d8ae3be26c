package ethtool

import (
	"strings"
	"testing"
)

func TestBadNames(t *testing.T) {
	if _, err := RxQueues(strings.Repeat("x", 16)); err == nil || !strings.Contains(err.Error(), "longer than 15 bytes") {
		t.Errorf("16-byte name: %v", err)
	}
	if err := DisableTxChecksum("no-such-if0"); err == nil || !strings.Contains(err.Error(), "no-such-if0") {
		t.Errorf("missing interface: %v", err)
	}
}
