package child

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A tool that outlives its deadline is killed, and the error says so; one
// that ends in time answers as exec's would.
func TestDeadline(t *testing.T) {
	defer func(d time.Duration) { Timeout = d }(Timeout)
	Timeout = 200 * time.Millisecond
	start := time.Now()
	err := Command("sleep", "10").Run()
	if took := time.Since(start); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "sleep killed after 200ms") || took > 3*time.Second {
		t.Errorf("a tool past its deadline: %v after %s, want ErrTimeout at once", err, took)
	}
	out, err := Command("echo", "hi").Output()
	if err != nil || string(out) != "hi\n" {
		t.Errorf("a tool in time: %q, %v", out, err)
	}
	if err := Command("false").Run(); err == nil || errors.Is(err, ErrTimeout) {
		t.Errorf("a tool that fails in time: %v, want its exit status, not a timeout", err)
	}
}
