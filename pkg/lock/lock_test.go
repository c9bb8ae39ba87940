package lock

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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

// A lock whose directory or file cannot be made says where.
func TestAcquireFailures(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(filepath.Join(file, "sub", "lock"), time.Second); err == nil || !strings.Contains(err.Error(), "create lock directory") {
		t.Errorf("lock under a file: %v", err)
	}
	dir := t.TempDir()
	if _, err := Acquire(dir, time.Second); err == nil || !strings.Contains(err.Error(), "open lock") {
		t.Errorf("lock on a directory: %v", err)
	}
}
