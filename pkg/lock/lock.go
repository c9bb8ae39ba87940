// Package lock is the host-wide lock that serializes the read-check-write
// sequences of concurrent plugin invocations (the runtime runs many ADD and
// DEL at once). Waiting is bounded: past the timeout the caller gets
// ErrTimeout and answers "try again later" instead of hanging.
package lock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultPath is where the lock file lives. Both backends share it.
const DefaultPath = "/run/cni-portmap.lock"

// Timeout bounds the wait for the host-wide lock.
const Timeout = 30 * time.Second

// Host takes the host-wide lock at DefaultPath, waiting at most Timeout:
// what the plugin, the agent and both backends take.
func Host() (release func(), err error) { return Acquire(DefaultPath, Timeout) }

// ErrTimeout is returned when the lock could not be taken in time.
var ErrTimeout = errors.New("timed out waiting for the portmap lock")

// Acquire takes the exclusive lock on path, polling until timeout. The
// returned function releases it.
func Acquire(path string, timeout time.Duration) (release func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create lock directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %q: %w", path, err)
	}
	deadline := time.Now().Add(timeout)
	delay := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %q: %w", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("%w %q after %s", ErrTimeout, path, timeout)
		}
		time.Sleep(delay)
		delay = min(delay*2, 50*time.Millisecond)
	}
}
