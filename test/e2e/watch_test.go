package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/nfevents"
	"github.com/portmap-dev/portmap/test/nettest"
)

// watcher is a running `portmap sync --watch` and its log.
type watcher struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  []string
	done chan error
}

func startWatch(t *testing.T, args ...string) *watcher {
	t.Helper()
	return startWatchOf(t, "portmap", nil, "watching", args...)
}

// startWatchOf runs `bin sync --watch args` (portmap or portmap-agent)
// with env added to the environment, and waits for it to log started.
func startWatchOf(t *testing.T, bin string, env []string, started string, args ...string) *watcher {
	t.Helper()
	w := &watcher{done: make(chan error, 1)}
	w.cmd = exec.Command(filepath.Join(nettest.BinDir(), bin), append([]string{"sync", "--watch"}, args...)...)
	w.cmd.Env = append(os.Environ(), env...)
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w.cmd.Stderr = w.cmd.Stdout
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
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
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		t.Logf("watch log:\n%s", w.text())
	})
	w.waitFor(t, started, 5*time.Second)
	return w
}

// terminate sends SIGTERM and wants the process to exit 0 within 3 s.
func (w *watcher) terminate(t *testing.T) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w.done:
		if err != nil {
			t.Errorf("after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("it did not stop within 3 s of SIGTERM")
	}
}

func (w *watcher) text() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.log, "\n")
}

// since is the log from line n on.
func (w *watcher) since(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.log[min(n, len(w.log)):], "\n")
}

func (w *watcher) lines() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.log)
}

func (w *watcher) waitFor(t *testing.T, s string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(w.text(), s) {
			return
		}
	}
	t.Fatalf("watch did not log %q within %s:\n%s", s, d, w.text())
}

// TestWatchRepairsWithinTwoSeconds: with `portmap sync --watch` running,
// host ports work again within 2 s of a flush of the firewall; with
// nothing changing it writes nothing (no nf_tables event in 3 s, while it
// passes every second); SIGTERM ends it cleanly.
func TestWatchRepairsWithinTwoSeconds(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := client(t)
		cache := t.TempDir()
		rt := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "watch", V4: "192.0.2.0/28", Extra: extra}, cache)
		c := rt.MustAdd(t, "w1", nettest.Mapping{HostPort: 6401, ContainerPort: srvPort},
			nettest.Mapping{HostPort: 6453, ContainerPort: srvPort, Protocol: "udp"})
		nettest.Serve(t, c.NS, "w1", srvPort)
		expectReply(t, cl, "tcp", addr(nodeIP, 6401), "w1", clientIP)

		w := startWatch(t, "--cache-dir", cache, "--interval", "1s")

		// Idle: passes every second, none writes.
		sub, err := nfevents.Subscribe()
		if err != nil {
			t.Fatal(err)
		}
		before := w.lines()
		select {
		case <-sub.C:
			t.Errorf("an idle watcher changed the firewall; log:\n%s", w.text())
		case <-time.After(3 * time.Second):
		}
		sub.Close()
		if w.lines() != before {
			t.Errorf("an idle watcher logged:\n%s", w.text())
		}

		for round := range 2 {
			b.flushFirewall(t)
			start := time.Now()
			var got string
			for time.Since(start) < 2*time.Second {
				if got, err = nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6401)); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil || got != "w1 sees "+clientIP {
				t.Fatalf("round %d: host port not back 2 s after the flush: %q, %v", round, got, err)
			}
			t.Logf("round %d: host port back %s after the flush", round, time.Since(start).Round(time.Millisecond))
			expectReply(t, cl, "udp", addr(nodeIP, 6453), "w1", clientIP)
		}
		w.waitFor(t, `msg="attachment repaired" network=watch container=w1 ifname=eth0`, time.Second)
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK after the watcher's repair: %v", err)
		}

		w.terminate(t)
		w.waitFor(t, "msg=stopping", time.Second)
	})
}
