package deadline

import (
	"testing"
	"time"
)

// A wait is its own bound without a deadline, what is left of one where
// that is less, and nothing once it has passed; clearing ends it.
func TestWithin(t *testing.T) {
	if got := Within(30 * time.Second); got != 30*time.Second {
		t.Errorf("no deadline: %s, want the bound", got)
	}
	clear := Set(time.Second)
	if got := Within(30 * time.Second); got > time.Second || got < 900*time.Millisecond {
		t.Errorf("a deadline 1 s away: %s, want about 1 s", got)
	}
	if got := Within(10 * time.Millisecond); got != 10*time.Millisecond {
		t.Errorf("a shorter bound: %s", got)
	}
	clear()
	if got := Within(30 * time.Second); got != 30*time.Second {
		t.Errorf("after clear: %s", got)
	}
	clear = Set(-time.Second)
	defer clear()
	if got := Within(30 * time.Second); got != 0 {
		t.Errorf("a deadline passed: %s, want 0", got)
	}
}
