package test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// allowed is the import rule of docs/ARCHITECTURE.md: which of this
// module's packages each package may import. Arrows point down:
// sockets → stack → vnic → xdp, with bpf beside xdp; timers and interrupts
// serve the stack; control is the protocol both sockets and the daemon
// speak, and nothing at or below sockets imports the daemon; the shim's
// Go core stands on sockets, as a program does (and speaks the control
// protocol to its forked children, handover.go). Packages not
// listed (test/, internal/, cmd/) may import anything.
var allowed = map[string][]string{
	"xdp":        {},
	"bpf":        {},
	"vnic":       {"xdp"},
	"timers":     {},
	"interrupts": {"bpf", "timers", "vnic", "xdp"},
	"stack":      {"bpf", "interrupts", "timers", "vnic", "xdp"},
	"control":    {},
	"sockets":    {"bpf", "control", "interrupts", "stack", "timers", "vnic", "xdp"},
	"daemon":     {"bpf", "control", "stack", "vnic", "xdp"},
	"shim/core":  {"control", "sockets", "stack"},
}

func TestImportRule(t *testing.T) {
	out, err := exec.Command("go", "list", "-json", "../...").Output()
	if err != nil {
		Missing(t, "go list failed: %v", err)
	}
	const mod = "github.com/xdp-onload/onload/"
	dec := json.NewDecoder(strings.NewReader(string(out)))
	seen := 0
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(p.ImportPath, mod)
		ok, ruled := allowed[name]
		if !ruled {
			continue
		}
		seen++
		for _, imp := range p.Imports {
			dep, ours := strings.CutPrefix(imp, mod)
			if !ours || strings.HasPrefix(dep, "internal/") {
				continue
			}
			permitted := false
			for _, a := range ok {
				permitted = permitted || a == dep
			}
			if !permitted {
				t.Errorf("%s imports %s: not allowed by the import rule (see docs/ARCHITECTURE.md)", name, dep)
			}
		}
	}
	if seen != len(allowed) {
		t.Errorf("found %d of the %d ruled packages", seen, len(allowed))
	}
}
