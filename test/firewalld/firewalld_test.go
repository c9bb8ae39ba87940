//go:build firewalld

// Package firewalld runs the plugin under a real firewalld: Debian 12's
// firewalld 1.3 and Debian 13's 2.3, each from a Debian root of its own
// (root.sh), chrooted in the test's network and mount namespaces with a
// D-Bus system bus of its own on a tmpfs over /run, never the machine's
// bus, service manager or firewall.
package firewalld

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	pmfirewalld "github.com/portmap-dev/portmap/pkg/firewalld"
	"github.com/portmap-dev/portmap/test/nettest"
)

// rootsEnv names the directory of the Debian roots (make firewalld-test
// makes them with root.sh): rootsEnv/SUITE/root.
const rootsEnv = "PORTMAP_FIREWALLD_ROOTS"

func TestMain(m *testing.M) {
	if os.Getenv(rootsEnv) == "" && !nettest.Isolated() {
		if os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "firewalld: %s is not set (make firewalld-test sets it)\n", rootsEnv)
			os.Exit(1)
		}
		fmt.Printf("firewalld: SKIP: %s is not set: run make firewalld-test\n", rootsEnv)
		os.Exit(0)
	}
	nettest.MainUnchanged(m, machine)
}

// machine is what the suite must leave as it found it: besides the
// rules and links, no firewalld settings, no bus, no firewalld state and
// no forwarding switched on in the machine's namespaces.
func machine() string {
	return nettest.Fingerprint([]string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"},
		[]string{"/etc/firewalld", "/run/dbus", "/run/firewalld", "/run/netns/cni-*", "/run/netns/cnitest-*", "/run/cni-portmap", "/var/lib/cni"})
}

// releases are the firewalld releases the suite runs: Debian's suite of
// each.
var releases = []struct{ name, suite string }{{"firewalld-1.3", "bookworm"}, {"firewalld-2.3", "trixie"}}

// firewalld is one firewalld, with its bus, in a root.
type firewalld struct {
	root     string
	bus, fwd *exec.Cmd
	log      string
	// conf is its firewalld.conf (bind-mounted over the root's): the one
	// Debian ships (shipped) with backend and the test's settings.
	conf, shipped, backend string
}

// configure writes firewalld.conf: as shipped, with the backend and
// settings ("KEY=VALUE") in place of the shipped ones. firewalld reads
// it as it starts and reloads.
func (f *firewalld) configure(t *testing.T, settings ...string) {
	t.Helper()
	settings = append([]string{"FirewallBackend=" + f.backend}, settings...)
	set := map[string]bool{}
	for _, c := range settings {
		k, _, _ := strings.Cut(c, "=")
		set[k] = true
	}
	var lines []string
	for _, l := range strings.Split(f.shipped, "\n") {
		if k, _, ok := strings.Cut(l, "="); !ok || !set[k] {
			lines = append(lines, l)
		}
	}
	lines = append(lines, settings...)
	if err := os.WriteFile(f.conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

var privateRun sync.Once

// ownRun mounts a tmpfs over /run in the test's mount namespace, once:
// the bus's socket, firewalld's state and /run/xtables.lock are the
// test's, shared with the roots (mountRoot binds it into each). It lays
// an overlay over /etc too, its changes on that tmpfs, so that the
// firewalld settings of a root can show at /etc/firewalld, where the
// plugin and the agent look for them (showSettings).
func ownRun(t *testing.T) {
	t.Helper()
	var err error
	privateRun.Do(func() {
		if err = unix.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"); err == nil {
			err = os.MkdirAll("/run/dbus", 0o755)
		}
		if err == nil { // the suite's own bus, for the agents it runs
			err = os.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/run/dbus/system_bus_socket")
		}
		up, work := "/run/portmap-etc/upper", "/run/portmap-etc/work"
		for _, d := range []string{up, work} {
			if err == nil {
				err = os.MkdirAll(d, 0o755)
			}
		}
		if err == nil {
			err = unix.Mount("overlay", "/etc", "overlay", 0, "lowerdir=/etc,upperdir="+up+",workdir="+work)
		}
	})
	if err != nil {
		t.Fatalf("a tmpfs over /run, an overlay over /etc: %v", err)
	}
}

// showSettings shows the root's /etc/firewalld at /etc/firewalld until
// the test ends: firewalld is installed there, as far as the plugin
// and the agent can tell.
func showSettings(t *testing.T, root string) {
	t.Helper()
	ownRun(t)
	if _, err := os.Stat("/run/portmap-etc/upper"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir("/etc/firewalld", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(filepath.Join(root, "etc/firewalld"), "/etc/firewalld", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount("/etc/firewalld", unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
		if err := os.Remove("/etc/firewalld"); err != nil {
			t.Error(err)
		}
	})
}

var mounted sync.Map

// mountRoot gives the root the test's /proc, /sys, /dev and /run, once.
func mountRoot(t *testing.T, root string) {
	t.Helper()
	if _, done := mounted.LoadOrStore(root, true); done {
		return
	}
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "proc", "proc"}, {"sysfs", "sys", "sysfs"}, {"/dev", "dev", ""}, {"/run", "run", ""},
	} {
		flags := uintptr(0)
		if m.fs == "" {
			flags = unix.MS_BIND | unix.MS_REC
		}
		if err := unix.Mount(m.src, filepath.Join(root, m.dst), m.fs, flags, ""); err != nil {
			t.Fatalf("mount %s on %s/%s: %v", m.src, root, m.dst, err)
		}
	}
}

// startFirewalld starts the release's bus and firewalld with backend
// (nftables or iptables) and its other settings as Debian ships them,
// plus conf's lines; both end with the test (firewalld removes its rules
// as it exits: CleanupOnExit).
func startFirewalld(t *testing.T, suite, backend string, conf ...string) *firewalld {
	t.Helper()
	ownRun(t)
	root := filepath.Join(os.Getenv(rootsEnv), suite, "root")
	mountRoot(t, root)
	etc := filepath.Join(root, "etc/firewalld")
	data, err := os.ReadFile(filepath.Join(etc, "firewalld.conf"))
	if err != nil {
		t.Fatal(err)
	}
	f := &firewalld{root: root, log: filepath.Join(t.TempDir(), "firewalld.log"), shipped: string(data),
		conf: filepath.Join(t.TempDir(), "firewalld.conf"), backend: backend}
	f.configure(t, conf...)
	if err := unix.Mount(f.conf, filepath.Join(etc, "firewalld.conf"), "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(etc, "firewalld.conf"), 0) })
	showSettings(t, root)

	f.bus = startBus(t, root)
	f.start(t)
	t.Cleanup(func() {
		f.stop()
		if t.Failed() {
			out, _ := os.ReadFile(f.log)
			t.Logf("firewalld's log:\n%s", out)
		}
	})
	return f
}

// start starts firewalld and waits until it runs.
func (f *firewalld) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(f.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	f.fwd = exec.Command("chroot", f.root, "/usr/sbin/firewalld", "--nofork", "--nopid")
	f.fwd.Stdout, f.fwd.Stderr = logf, logf
	if err := f.fwd.Start(); err != nil {
		t.Fatal(err)
	}
	if !nettest.Eventually(30*time.Second, func() bool { out, _ := f.cmd("--state"); return out == "running" }) {
		out, _ := os.ReadFile(f.log)
		t.Fatalf("firewalld not running 30 s after its start:\n%s", out)
	}
}

// stop ends firewalld as its service does (SIGTERM: it removes its rules
// as it exits).
func (f *firewalld) stop() {
	_ = f.fwd.Process.Signal(unix.SIGTERM)
	_ = f.fwd.Wait()
}

// startBus starts the root's dbus-daemon as the system bus, on the
// test's /run; it ends with the test.
func startBus(t *testing.T, root string) *exec.Cmd {
	t.Helper()
	ownRun(t)
	mountRoot(t, root)
	_ = os.Remove("/run/dbus/system_bus_socket")
	bus := exec.Command("chroot", root, "dbus-daemon", "--system", "--nopidfile", "--nofork")
	if err := bus.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Process.Kill(); _ = bus.Wait() })
	if !nettest.Eventually(10*time.Second, func() bool { _, err := os.Stat("/run/dbus/system_bus_socket"); return err == nil }) {
		t.Fatal("no system bus 10 s after dbus-daemon's start")
	}
	return bus
}

// cmd runs the root's firewall-cmd and returns its output.
func (f *firewalld) cmd(args ...string) (string, error) {
	out, err := exec.Command("chroot", append([]string{f.root, "firewall-cmd"}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

var clientNet = nettest.ClientNet{HostIf: "fw0", V4: "198.51.130", V6: "2001:db8:130:"}

// The container's host port and its server's port; a port of the
// node's own that no zone opens.
const (
	hostPort = 8080
	srvPort  = 80
	nodePort = 9999
)

func addr(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }

// TestBusWithoutFirewalld: on a system bus where no firewalld runs (most
// nodes with a bus), the plugin finds StrictForwardPorts off, without a
// question where firewalld is not installed, after one where it is; the
// agent's passes do not wait.
func TestBusWithoutFirewalld(t *testing.T) {
	root := filepath.Join(os.Getenv(rootsEnv), "trixie", "root")
	startBus(t, root)
	ask := func(what string) {
		start := time.Now()
		strict, _, err := pmfirewalld.StrictForwardPorts()
		t.Logf("StrictForwardPorts, %s: %s", what, time.Since(start))
		if strict || err != nil {
			t.Errorf("StrictForwardPorts, %s: %v %v, want false and no error", what, strict, err)
		}
	}
	ask("firewalld not installed")
	t.Run("installed", func(t *testing.T) {
		showSettings(t, root)
		ask("firewalld installed, not running")
	})
	b, err := pmfirewalld.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	start := time.Now()
	if err := b.Settle(10 * time.Second); err != nil || time.Since(start) > time.Second {
		t.Errorf("Settle without firewalld: %v after %s, want nil at once", err, time.Since(start))
	}
}
