package firewalld

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestConfStrict(t *testing.T) {
	for _, c := range []struct {
		name, conf string
		want       bool
	}{
		{"as shipped", "# StrictForwardPorts\n# If set to yes...\nStrictForwardPorts=no\n", false},
		{"on", "FirewallBackend=nftables\nStrictForwardPorts=yes\n", true},
		{"spaces and case", "  StrictForwardPorts = True  \n", true},
		{"any other value is on, as firewalld reads it", "StrictForwardPorts=1\n", true},
		{"false", "StrictForwardPorts=FALSE\n", false},
		{"the first definition counts", "StrictForwardPorts=yes\nStrictForwardPorts=no\n", true},
		{"an empty value is skipped", "StrictForwardPorts=\nStrictForwardPorts=yes\n", true},
		{"commented out", "#StrictForwardPorts=yes\n;StrictForwardPorts=yes\n", false},
		{"two equals signs are no definition", "StrictForwardPorts=yes=no\n", false},
		{"missing (firewalld 1.3)", "FirewallBackend=nftables\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "firewalld.conf")
			if err := os.WriteFile(f, []byte(c.conf), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := confStrict(f)
			if err != nil || got != c.want {
				t.Errorf("confStrict(%q) = %v, %v; want %v", c.conf, got, err, c.want)
			}
		})
	}
	if got, err := confStrict(filepath.Join(t.TempDir(), "none")); got || err != nil {
		t.Errorf("confStrict of a missing file = %v, %v; want false, nil", got, err)
	}
	if _, err := confStrict(t.TempDir()); err == nil {
		t.Error("confStrict of a directory: no error")
	}
}

// TestStrictForwardPortsFallsBackToTheFile: where no bus is reachable,
// StrictForwardPorts reads firewalld.conf; where firewalld is not
// installed, it is off.
func TestStrictForwardPortsFallsBackToTheFile(t *testing.T) {
	dir := t.TempDir()
	oldEtc, oldUsr := etcDir, usrDir
	t.Cleanup(func() { etcDir, usrDir = oldEtc, oldUsr })
	etcDir, usrDir = filepath.Join(dir, "etc"), filepath.Join(dir, "usr")
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+filepath.Join(dir, "no-bus"))

	if got, _, err := StrictForwardPorts(); got || err != nil {
		t.Errorf("without firewalld: %v, %v; want false, nil", got, err)
	}
	if err := os.Mkdir(etcDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, note, err := StrictForwardPorts(); got || err != nil || note != "" {
		t.Errorf("installed, no firewalld.conf, no bus: %v, %q, %v; want false, no note, nil", got, note, err)
	}
	if err := os.WriteFile(filepath.Join(etcDir, "firewalld.conf"), []byte("StrictForwardPorts=yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _, err := StrictForwardPorts(); !got || err != nil {
		t.Errorf("StrictForwardPorts=yes in firewalld.conf, no bus: %v, %v; want true, nil", got, err)
	}
}

// wedgedBus is a system bus socket that never answers: one that accepts
// connections and says nothing (a stopped dbus-daemon), or, with accept
// false, one whose backlog is full, so that connecting itself waits.
func wedgedBus(t *testing.T, accept bool) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bus") // a D-Bus address takes no comma
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "system_bus_socket")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	backlog := 16
	if !accept {
		backlog = 0
	}
	if err := unix.Listen(fd, backlog); err != nil {
		t.Fatal(err)
	}
	if accept {
		go func() {
			for {
				c, _, err := unix.Accept(fd)
				if err != nil {
					return
				}
				t.Cleanup(func() { unix.Close(c) })
			}
		}()
		return sock
	}
	// fill the backlog: the next connect waits for an accept that never comes
	for range 3 {
		c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(c) })
		_ = unix.Connect(c, &unix.SockaddrUnix{Name: sock}) // EAGAIN once full
	}
	return sock
}

// TestStrictForwardPortsOnAWedgedBus: where firewalld is installed and the
// system bus never answers (it accepts and says nothing, or does not
// accept: the kernel refuses the connection at once), ADD's question
// ends within ConnectTimeout, reads firewalld.conf instead and says
// why; the agent's Connect fails in that time too.
func TestStrictForwardPortsOnAWedgedBus(t *testing.T) {
	oldEtc := etcDir
	t.Cleanup(func() { etcDir = oldEtc })
	etcDir = t.TempDir()
	if err := os.WriteFile(filepath.Join(etcDir, "firewalld.conf"), []byte("StrictForwardPorts=yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, accept := range []bool{true, false} {
		t.Run(map[bool]string{true: "accepts, never answers", false: "never accepts"}[accept], func(t *testing.T) {
			t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+wedgedBus(t, accept))
			start := time.Now()
			strict, note, err := StrictForwardPorts()
			took := time.Since(start)
			t.Logf("StrictForwardPorts: %v, %q, %v after %s", strict, note, err, took.Round(time.Millisecond))
			why := map[bool]string{true: "no answer in 2s", false: "resource temporarily unavailable"}[accept]
			if !strict || err != nil || !strings.Contains(note, "firewalld.conf") || !strings.Contains(note, why) {
				t.Errorf("got %v, %q, %v; want firewalld.conf's yes, with a note saying %q", strict, note, err, why)
			}
			if took > ConnectTimeout+time.Second || accept && took < ConnectTimeout {
				t.Errorf("took %s, want at most the bound, %s", took, ConnectTimeout)
			}
			start = time.Now()
			b, err := Connect()
			took = time.Since(start)
			if err == nil {
				b.Close()
				t.Fatal("Connect to a bus that never answers succeeded")
			}
			if took > ConnectTimeout+time.Second || !strings.Contains(err.Error(), why) {
				t.Errorf("Connect: %v after %s, want no answer within %s", err, took, ConnectTimeout)
			}
		})
	}
}
