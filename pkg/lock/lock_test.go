package lock

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestAcquireExcludesAndTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "portmap.lock")
	release, err := Acquire(path, time.Second)
	if err != nil {
		t.Fatalf("first acquire: %v", err)
	}
	start := time.Now()
	if _, err := Acquire(path, 100*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("second acquire while held: got %v, want ErrTimeout", err)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Fatalf("second acquire gave up after %s, before its timeout", waited)
	}
	release()
	release2, err := Acquire(path, time.Second)
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	release2()
}
