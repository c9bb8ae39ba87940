package lock

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/deadline"
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

// The host lock waits within the verb's deadline: a verb that asks for
// it again and again while another holds it waits what is left of its
// deadline in all, not Timeout each time.
func TestHostLockWithinTheDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "portmap.lock")
	release, err := Acquire(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	defer deadline.Set(300 * time.Millisecond)()
	start := time.Now()
	for i := range 7 {
		if _, err := hostAt(path); !errors.Is(err, ErrTimeout) {
			t.Fatalf("wait %d for the held lock: %v, want ErrTimeout", i, err)
		}
	}
	if took := time.Since(start); took < 250*time.Millisecond || took > 2*time.Second {
		t.Errorf("seven waits for the held lock took %s, want the deadline's 300 ms", took)
	}
}

// A lock held past the timeout names its holder as /proc/locks does:
// another process here (flock(1) holding it while it sleeps).
func TestTimeoutNamesTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "portmap.lock")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// -o: sleep does not inherit the lock, flock(1) holds it alone
	holder := exec.Command("flock", "-o", path, "sleep", "30")
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Fatalf("flock(1): %v", err)
	}
	stop := func() { syscall.Kill(-holder.Process.Pid, syscall.SIGKILL); holder.Wait() }
	defer stop()
	want := fmt.Sprintf(", held by pid %d (flock)", holder.Process.Pid)
	for i := 0; HeldBy(path) != want; i++ { // until flock(1) has it
		if i == 200 {
			t.Fatalf("flock(1) did not take the lock in 4 s: HeldBy %q", HeldBy(path))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := Acquire(path, 50*time.Millisecond); !errors.Is(err, ErrTimeout) || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("acquire while flock(1) holds it: %v, want ErrTimeout ending %q", err, want)
	}
	stop()
	if got := HeldBy(path); got != "" {
		t.Errorf("HeldBy after the holder exited: %q", got)
	}
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
