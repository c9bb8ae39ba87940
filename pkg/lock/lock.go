// Package lock is the host-wide lock that serializes the read-check-write
// sequences of concurrent plugin invocations (the runtime runs many ADD and
// DEL at once). Waiting is bounded: past the timeout the caller gets
// ErrTimeout and answers "try again later" instead of hanging.
package lock

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/deadline"
)

// DefaultPath is where the lock file lives. Both backends share it.
const DefaultPath = "/run/cni-portmap.lock"

// Timeout bounds the wait for the host-wide lock.
const Timeout = 30 * time.Second

// Host takes the host-wide lock at DefaultPath, waiting at most Timeout,
// and no longer than the verb's or pass's deadline (pkg/deadline):
// what the plugin, the agent and both backends take.
func Host() (release func(), err error) { return hostAt(DefaultPath) }

func hostAt(path string) (release func(), err error) {
	return Acquire(path, deadline.Within(Timeout))
}

// ErrTimeout is returned when a lock could not be taken in time: the
// portmap lock here, or the xtables lock an iptables tool gave up on
// (the iptables backend wraps it). Callers answer "try again later".
var ErrTimeout = errors.New("timed out waiting for a lock")

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
			return nil, fmt.Errorf("%w: the portmap lock %q after %s%s", ErrTimeout, path, timeout, HeldBy(path))
		}
		time.Sleep(delay)
		delay = min(delay*2, 50*time.Millisecond)
	}
}

// HeldBy names the process holding a lock on the file at path as the
// kernel lists it in /proc/locks: ", held by pid 1234 (portmap-agent)";
// "" where it cannot tell (no lock now, a lock without an owner such as
// an open file description's, a process of another PID namespace).
func HeldBy(path string) string {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return ""
	}
	file := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	f, err := os.Open("/proc/locks")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 1: FLOCK  ADVISORY  WRITE 1234 00:19:5678 0 EOF
		// (a waiter's line has "->" after the number)
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] == "->" || fields[5] != file {
			continue
		}
		pid, err := strconv.Atoi(fields[4])
		if err != nil || pid <= 0 {
			return ""
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil { // a process it started holds the file open
			return fmt.Sprintf(", held since pid %d (exited) took it", pid)
		}
		return fmt.Sprintf(", held by pid %d (%s)", pid, strings.TrimSpace(string(comm)))
	}
	return ""
}
