package nodesafety

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/firewalld"
	"github.com/portmap-dev/portmap/test/nettest"
)

// firewalldInstalled shows a directory of the test's at /etc/firewalld
// (an overlay over /etc in the test's own mount namespace, its changes
// on a tmpfs of the test's) until the test ends, so that the plugin and
// the agent take firewalld for installed; it returns that directory.
func firewalldInstalled(t *testing.T) string {
	t.Helper()
	if !nettest.Isolated() {
		t.Fatal("an overlay over /etc outside the test's own mount namespace")
	}
	tmp := t.TempDir()
	if err := unix.Mount("tmpfs", tmp, "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(tmp, unix.MNT_DETACH) })
	up, work := filepath.Join(tmp, "upper"), filepath.Join(tmp, "work")
	for _, d := range []string{filepath.Join(up, "firewalld"), work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("overlay", "/etc", "overlay", 0, "lowerdir=/etc,upperdir="+up+",workdir="+work); err != nil {
		t.Fatalf("an overlay over /etc: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount("/etc", unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the overlay over /etc: %v", err)
		}
	})
	return "/etc/firewalld"
}

// systemBus shows sock where a node's system bus is, for the rest of the
// test: its directory over /run/dbus in the test's own mount namespace,
// so that the plugin and the agent, which chroots into the node's / from
// its pod as the DaemonSet runs it, find it with no
// DBUS_SYSTEM_BUS_ADDRESS. A machine without /run/dbus gets no directory
// made: the address names sock instead.
func systemBus(t *testing.T, sock string) {
	t.Helper()
	if !nettest.Isolated() {
		t.Fatal("a bus over /run/dbus outside the test's own mount namespace")
	}
	if _, err := os.Stat("/run/dbus"); err != nil {
		t.Logf("no /run/dbus on this machine (%v): the bus is named by DBUS_SYSTEM_BUS_ADDRESS", err)
		t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+sock)
		return
	}
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "")
	os.Unsetenv("DBUS_SYSTEM_BUS_ADDRESS")
	if err := unix.Mount(filepath.Dir(sock), "/run/dbus", "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("the test's bus over /run/dbus: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount("/run/dbus", unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the test's bus from /run/dbus: %v", err)
		}
	})
}

// TestWedgedBus: where firewalld is installed and the system bus accepts
// connections and never answers, ADD of a host port answers within
// firewalld.ConnectTimeout and a second more, with either backend: it
// takes firewalld.conf's word (none: off, the port is mapped and
// answers; StrictForwardPorts=yes: refused, code 50). The agent, run as
// the DaemonSet runs it, is ready (its first pass done) without waiting
// for the bus. The bus is where a node's is (/run/dbus).
func TestWedgedBus(t *testing.T) {
	etc := firewalldInstalled(t)
	systemBus(t, nettest.WedgedBus(t))
	bound := firewalld.ConnectTimeout + time.Second
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		cl := lan(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "bus", V4: "192.0.2.64/28", Extra: extra})
		start := time.Now()
		c, err := rt.Add(t, "c1", nettest.Mapping{HostPort: 6200, ContainerPort: srvPort})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("ADD beside a wedged bus: %v", err)
		}
		t.Cleanup(func() { _ = rt.Del(c) })
		t.Logf("ADD beside a wedged bus, no firewalld.conf: mapped after %s", took.Round(time.Millisecond))
		if took > bound {
			t.Errorf("ADD took %s, want at most %s", took, bound)
		}
		nettest.Serve(t, c.NS, "c1", srvPort)
		if got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6200)); err != nil || !strings.HasPrefix(got, "c1 sees ") {
			t.Errorf("the host port: %q, %v", got, err)
		}

		conf := filepath.Join(etc, "firewalld.conf")
		if err := os.WriteFile(conf, []byte("StrictForwardPorts=yes\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(conf)
		start = time.Now()
		_, err = rt.Add(t, "c2", nettest.Mapping{HostPort: 6201, ContainerPort: srvPort})
		took = time.Since(start)
		if nettest.Code(err) != 50 || !strings.Contains(err.Error(), "StrictForwardPorts") {
			t.Errorf("ADD beside a wedged bus, StrictForwardPorts=yes in firewalld.conf: %v (code %d), want code 50", err, nettest.Code(err))
		}
		t.Logf("ADD beside a wedged bus, StrictForwardPorts=yes in firewalld.conf: refused after %s", took.Round(time.Millisecond))
		if took > bound {
			t.Errorf("ADD took %s, want at most %s", took, bound)
		}
	})
	t.Run("agent", func(t *testing.T) {
		w := nettest.NewNode(t).WatchAsPod(t, daemonSetCaps(t), `msg=watching`, "--cache-dir", t.TempDir())
		at := func(msg string) time.Time {
			t.Helper()
			m := regexp.MustCompile(`time=(\S+) level=\S+ msg=` + regexp.QuoteMeta(msg)).FindStringSubmatch(w.Text())
			if m == nil {
				t.Fatalf("no %s in the log:\n%s", msg, w.Text())
			}
			ts, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				t.Fatal(err)
			}
			return ts
		}
		watching, gaveUp := at("watching"), at(`"no system bus`)
		t.Logf("the agent was watching %s before it gave up on the bus", gaveUp.Sub(watching).Round(time.Millisecond))
		if gaveUp.Sub(watching) < firewalld.ConnectTimeout/2 {
			t.Errorf("the agent started watching %s before it gave up on the bus: it waited for the bus", gaveUp.Sub(watching))
		}
	})
}
