package nettest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// LogTB is a TB that logs.
type LogTB interface {
	TB
	Logf(format string, args ...any)
}

// Watcher is a running `portmap-agent sync --watch` (or portmap-agent's) and
// its log.
type Watcher struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  []string
	done chan error
}

// StartWatch runs `bin sync --watch args` (bin: portmap or
// portmap-agent, from BinDir) with env added to the environment, waits
// for it to log started (the agent: and what it found of the system
// bus), and kills it at the end of the test, logging its log.
func StartWatch(tb LogTB, bin string, env []string, started string, args ...string) *Watcher {
	tb.Helper()
	cmd := exec.Command(filepath.Join(BinDir(), bin), append([]string{"sync", "--watch"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	return startWatch(tb, cmd, bin == "portmap-agent", started)
}

// startWatch starts cmd, a watcher, as StartWatch does; agent says it
// is portmap-agent.
func startWatch(tb LogTB, cmd *exec.Cmd, agent bool, started string) *Watcher {
	tb.Helper()
	w := &Watcher{done: make(chan error, 1), cmd: cmd}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	w.cmd.Stderr = w.cmd.Stdout
	if err := w.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.mu.Lock()
			w.log = append(w.log, sc.Text())
			w.mu.Unlock()
		}
		w.done <- w.cmd.Wait()
	}()
	tb.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		tb.Logf("watch log:\n%s", w.Text())
	})
	w.WaitFor(tb, started, 5*time.Second)
	if agent {
		// it looks for firewalld's bus in the background and says what it
		// found ("following firewalld on the system bus", "no system
		// bus"): after that, its log is quiet while nothing changes
		w.WaitFor(tb, "system bus", 5*time.Second)
	}
	return w
}

// Kill ends it with SIGKILL, as a crash or an OOM kill would, and waits.
func (w *Watcher) Kill() {
	_ = w.cmd.Process.Kill()
	<-w.done
}

// Terminate sends SIGTERM and wants the process to exit 0 within 3 s.
func (w *Watcher) Terminate(tb TB) {
	tb.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		tb.Fatal(err)
	}
	select {
	case err := <-w.done:
		if err != nil {
			tb.Errorf("after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(3 * time.Second):
		tb.Fatal("it did not stop within 3 s of SIGTERM")
	}
}

// Text is its log so far.
func (w *Watcher) Text() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.log, "\n")
}

// Since is its log from line n on.
func (w *Watcher) Since(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.log[min(n, len(w.log)):], "\n")
}

// Lines counts the lines of its log so far.
func (w *Watcher) Lines() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.log)
}

// WaitFor waits at most d for s to appear in its log.
func (w *Watcher) WaitFor(tb TB, s string, d time.Duration) {
	tb.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(w.Text(), s) {
			return
		}
	}
	tb.Fatalf("watch did not log %q within %s:\n%s", s, d, w.Text())
}

// Eventually polls cond every 50 ms for d and says whether it held.
func Eventually(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}
