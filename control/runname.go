package control

import (
	"fmt"
	"strings"
)

// runPrefix begins the stack names `onloadd run` gives when it is not
// given one (RunStackName).
const runPrefix = "run-"

// RunStackName is the name `onloadd run` gives the stack of the
// processes of one command it runs without -n: pid is the command's
// (onloadd run execs it), nonce tells apart commands that had the same
// pid. Every process of the command shares the stack, as Onload's
// forked children share their parent's: a pre-fork server's workers
// share its listening socket there, where each on a stack of its own
// left all but the first on the kernel, and the first with every
// connection.
func RunStackName(pid int, nonce uint32) string {
	return fmt.Sprintf("%s%d-%08x", runPrefix, pid, nonce)
}

// IsRunStackName reports whether name is one RunStackName gives.
func IsRunStackName(name string) bool { return strings.HasPrefix(name, runPrefix) }

// SameRunKind reports whether a stack named a (an orphan, whose processes
// are gone) may go to a process that asks for a stack named b when no
// queue is free: a stack with no name, or with one `onloadd run` gave,
// goes to a process asking for either (a server restarted at once is a
// new command, with another name); a name a user gave, to that name
// alone.
func SameRunKind(a, b string) bool {
	if a == b {
		return true
	}
	return (a == "" || IsRunStackName(a)) && (b == "" || IsRunStackName(b))
}
