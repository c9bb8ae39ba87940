package main

import "testing"

// Only usage errors: a pass would read (and could repair) the kernel
// state of the namespace the unit tests run in.
func TestSyncUsage(t *testing.T) {
	if got := syncMain([]string{"--bogus"}); got != 2 {
		t.Errorf("bad flag: exit %d, want 2", got)
	}
	if got := syncMain([]string{"extra"}); got != 2 {
		t.Errorf("extra argument: exit %d, want 2", got)
	}
	if got := syncMain([]string{"--watch", "--json"}); got != 2 {
		t.Errorf("--watch --json: exit %d, want 2", got)
	}
}
