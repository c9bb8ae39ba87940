// Package nettest is the harness of the privileged tests and the demo: it
// runs the test binary in a network namespace of its own (so nothing touches
// the root namespace's rules, sysctls or interfaces), builds the real CNI
// plugins, makes container and client namespaces, and sends real traffic
// between them. It also holds what every test shares, once: the CNI_*
// environment of a plugin run (PluginEnv), the plugin's stdin (PortmapConf),
// the golden-file loop (Golden, -update) and the unit tests' IP plan
// (TestPlan, SyncPlans).
package nettest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const (
	childEnv = "PORTMAP_NETTEST_ISOLATED"
	// BinEnv names a directory holding ptp, bridge, host-local, portmap
	// (ours) and portmap-upstream; without it Main builds them.
	BinEnv = "PORTMAP_CNI_BIN"
)

// Main is TestMain for privileged packages. As root it re-runs the test
// binary in a new network, mount and PID namespace (the test binary is its
// init, whose mount table is the node's) and exits with its status;
// inside, it brings loopback up and runs the tests. Not as root it skips
// with a message, except under CI=true, where privileged tests must run.
func Main(m *testing.M) {
	RunClientIfAsked()
	if os.Getenv(childEnv) == "1" {
		if err := setupIsolated(); err != nil {
			fmt.Fprintf(os.Stderr, "nettest: %v\n", err)
			os.Exit(1)
		}
		os.Exit(m.Run())
	}
	RequireRoot("privileged tests", "they make their own network namespaces")
	remove, err := ensureBinaries()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nettest: %v\n", err)
		os.Exit(1)
	}
	status := Reexec(os.Args)
	remove()
	os.Exit(status)
}

// MainUnchanged is Main that also fails the run where fingerprint,
// taken in the machine's namespaces before and after the isolated run,
// changed (see Fingerprint), printing how.
func MainUnchanged(m *testing.M, fingerprint func() string) {
	if Isolated() {
		Main(m)
	}
	RequireRoot("privileged tests", "they make their own network namespaces")
	remove, err := ensureBinaries()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nettest: %v\n", err)
		os.Exit(1)
	}
	before := fingerprint()
	status := Reexec(os.Args)
	remove()
	if d := Changed(before, fingerprint()); d != "" {
		fmt.Fprintf(os.Stderr, "nettest: the tests changed the machine:\n%s", d)
		status = 1
	}
	os.Exit(status)
}

// MainInPlace is TestMain for privileged packages that must stay in the
// node's namespaces (the image tests: podman needs the node's cgroup
// mounts): the same root rule as Main, without the re-run.
func MainInPlace(m *testing.M, what, why string) {
	RequireRoot(what, why)
	os.Exit(m.Run())
}

// RequireRoot exits unless the process is root: with status 0 and a SKIP
// line outside CI, with status 1 under CI=true, where privileged tests
// must run.
func RequireRoot(what, why string) {
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		fmt.Fprintf(os.Stderr, "nettest: %s must run as root under CI=true\n", what)
		os.Exit(1)
	}
	fmt.Printf("nettest: SKIP: %s need root (%s)\n", what, why)
	os.Exit(0)
}

// Reexec runs argv in a new network and mount namespace with the isolation
// marker set, wiring its standard streams to ours, and returns its exit
// status.
func Reexec(argv []string) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), childEnv+"=1")
	// A PID namespace too: the test binary is its first process, so the
	// node's init that the plugin asks about (/proc/1: its mount
	// namespace, its mount table) is the test's, whose mounts (the
	// tests' bpf filesystems and cgroup hierarchies) are the node's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "nettest: run isolated: %v\n", err)
		return 1
	}
	return 0
}

// runDir is where the plugin keeps its state on a node.
const runDir = "/run/cni-portmap"

// Isolated reports whether this process runs in the namespace Main made.
func Isolated() bool { return os.Getenv(childEnv) == "1" }

func setupIsolated() error {
	// Mounts made here (network namespace files) stay here.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// A sysfs of this namespace, for tools that read /sys/class/net.
	_ = unix.Mount("sysfs", "/sys", "sysfs", 0, "")
	// The plugin's state in /run (its ledger, the socket path's cgroup
	// mount) stays here too: a tmpfs of this namespace over
	// /run/cni-portmap, gone with it.
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return fmt.Errorf("make %s: %w", runDir, err)
	}
	if err := unix.Mount("tmpfs", runDir, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", runDir, err)
	}
	// The test binary is the node's init here, so a plugin run in its
	// mount namespace may mount a cgroup v2 hierarchy where none is
	// (the socket path's default site, PrivateCgroup2): that would be
	// the machine's whole hierarchy, its root. A file where that mount
	// would go makes such an ADD fail instead; a test that wants the
	// default sites runs the plugin in a Node, or in a mount namespace
	// of the runtime's own, which mounts nothing.
	if err := os.WriteFile(filepath.Join(runDir, "cgroupv2"), []byte("no cgroup v2 mount here: the machine's hierarchy is not the tests'\n"), 0o444); err != nil {
		return err
	}
	// The agents the tests run follow firewalld on the system bus: never
	// the machine's (a suite with a bus of its own names it).
	if err := os.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+runDir+"/no-system-bus"); err != nil {
		return err
	}
	// Before /proc is this PID namespace's, its 1 is the machine's init.
	self, err1 := os.Readlink("/proc/self/ns/net")
	root, err2 := os.Readlink("/proc/1/ns/net")
	if err1 == nil && err2 == nil && self == root {
		return fmt.Errorf("refusing to run: still in the root network namespace")
	}
	if os.Getpid() == 1 {
		if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount a /proc of this PID namespace: %w", err)
		}
	}
	return setupNS()
}

// setupNS prepares the current thread's (new) namespace: loopback up, and
// no IPv6 duplicate address detection, so addresses work at once instead
// of after a second or two of "tentative".
func setupNS() error {
	for _, k := range []string{"all", "default"} {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/accept_dad", []byte("0"), 0o644); err != nil {
			return fmt.Errorf("disable DAD: %w", err)
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	return netlink.LinkSetUp(lo)
}

// BinDir is the directory of CNI plugin binaries for the tests.
func BinDir() string { return os.Getenv(BinEnv) }

// ensureBinaries builds our plugin, the real ptp, bridge, host-local, loopback
// plugins and the upstream portmap from the module versions in go.mod,
// unless BinEnv already names a directory. The directory it makes is
// open to every user (a test runs the plugin as nobody), and remove
// deletes it.
func ensureBinaries() (remove func(), err error) {
	if dir := os.Getenv(BinEnv); dir != "" {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "portmap-cni-bin-")
	if err != nil {
		return nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	if err := os.Chmod(dir, 0o755); err != nil {
		remove()
		return nil, err
	}
	if err := BuildPlugins(dir); err != nil {
		remove()
		return nil, err
	}
	return remove, os.Setenv(BinEnv, dir)
}

// upstreamPortmap is the upstream plugin among go.mod's tools; it is
// built as portmap-upstream, beside ours.
const upstreamPortmap = "github.com/containernetworking/plugins/plugins/meta/portmap"

// BuildPlugins builds every binary the tests, the demo and the benchmark
// run into dir: the tools go.mod's tool block lists (the real ptp, bridge
// and host-local, cnitool, and upstream portmap as portmap-upstream, all
// at the module versions go.mod pins), our plugin and the demo's server.
// `make plugins` runs it too, so the list lives in go.mod alone.
func BuildPlugins(dir string) error {
	out, err := exec.Command("go", "list", "tool").Output()
	if err != nil {
		return fmt.Errorf("go list tool: %w", err)
	}
	var tools []string
	for _, t := range strings.Fields(string(out)) {
		if t != upstreamPortmap {
			tools = append(tools, t)
		}
	}
	steps := [][]string{
		append([]string{"build", "-o", dir + "/", "github.com/portmap-dev/portmap/test/demo/httpdemo"}, tools...),
		{"build", "-buildvcs=auto", "-o", dir + "/", "github.com/portmap-dev/portmap/cmd/portmap", "github.com/portmap-dev/portmap/cmd/portmap-agent"},
		{"build", "-o", filepath.Join(dir, "portmap-upstream"), upstreamPortmap},
	}
	for _, args := range steps {
		cmd := exec.Command("go", args...)
		// Static, as the plugins' release builds are and `make build`
		// is: no dynamic loader, no libc of the build host's version.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// TB is the part of testing.TB the harness uses, so the benchmark (a plain
// program) can use it too.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// SetupIsolated prepares the namespace Reexec made; Main calls it for
// tests, programs call it themselves.
func SetupIsolated() error { return setupIsolated() }

// SetupNetNS prepares a new network namespace as Main's is: loopback up,
// no duplicate address detection (suites that make their namespaces
// themselves, as the kube suite does).
func SetupNetNS() error { return setupNS() }

// MarkIsolated tells the harness that this process runs in namespaces a
// suite made itself, as Main's (the kube suite's node): the helpers that
// need them (NewCgroupSite) work there too.
func MarkIsolated() { _ = os.Setenv(childEnv, "1") }
