package sdnotify

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestNotify(t *testing.T) {
	for _, abstract := range []bool{false, true} {
		name := filepath.Join(t.TempDir(), "notify")
		env := name
		if abstract {
			name = "\x00portmap-test-" + strconv.Itoa(os.Getpid())
			env = "@" + name[1:]
		}
		ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		t.Setenv("NOTIFY_SOCKET", env)
		n := FromEnv()
		for _, state := range []string{"READY=1", "WATCHDOG=1"} {
			if err := n.Notify(state); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			_ = ln.SetReadDeadline(time.Now().Add(time.Second))
			k, err := ln.Read(buf)
			if err != nil || string(buf[:k]) != state {
				t.Errorf("abstract=%v: got %q, %v; want %q", abstract, buf[:k], err, state)
			}
		}
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if n := FromEnv(); n != nil || n.Notify("READY=1") != nil {
		t.Errorf("without NOTIFY_SOCKET: %v, want a nil notifier that sends nothing", n)
	}
}

func TestWatchdogInterval(t *testing.T) {
	for _, c := range []struct {
		usec, pid string
		want      time.Duration
	}{
		{"", "", 0},
		{"x", "", 0},
		{"20000000", "", 10 * time.Second},
		{"20000000", strconv.Itoa(os.Getpid()), 10 * time.Second},
		{"20000000", "1", 0},
	} {
		t.Setenv("WATCHDOG_USEC", c.usec)
		t.Setenv("WATCHDOG_PID", c.pid)
		if got := WatchdogInterval(); got != c.want {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: %s, want %s", c.usec, c.pid, got, c.want)
		}
	}
}
