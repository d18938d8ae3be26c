package control

import "testing"

func TestRunStackName(t *testing.T) {
	a, b := RunStackName(4242, 0xbeef), RunStackName(4242, 0xcafe)
	if a == b || !IsRunStackName(a) || IsRunStackName("web") || IsRunStackName("") {
		t.Fatalf("names %q and %q: want distinct, and only they onloadd run's", a, b)
	}
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"", "", true},
		{"web", "web", true},
		{"", a, true},
		{a, b, true},
		{b, "", true},
		{"web", "", false},
		{"", "web", false},
		{a, "web", false},
		{"web", "www", false},
	} {
		if got := SameRunKind(c.a, c.b); got != c.same {
			t.Errorf("SameRunKind(%q, %q) = %v, want %v", c.a, c.b, got, c.same)
		}
	}
}
