package nodesafety

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/test/nettest"
)

// mounts is the test's bpf and cgroup mounts, as the plugin's would be
// (the containers' namespace files come and go).
func mounts(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && (slices.Contains(f, "bpf") || slices.Contains(f, "cgroup2") || slices.Contains(f, "cgroup")) {
			out = append(out, f[4]+" "+strings.Join(f[len(f)-3:], " "))
		}
	}
	return strings.Join(out, "\n")
}

// TestSocketPathMountsNothingPrivate: a runtime that calls the plugin
// from a mount namespace of its own (here the test's, whose /sys is a
// sysfs of its own: no bpf filesystem at /sys/fs/bpf, no cgroup v2
// hierarchy) and wants the socket path at its default places gets code
// 50 naming what is missing and why, and nothing is mounted: a bpf
// filesystem mounted there would die with the runtime's namespace, and
// the links pinned in it. "auto" takes the NAT path instead.
func TestSocketPathMountsNothingPrivate(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		cl := lan(t)
		before := mounts(t)
		extra["localhost"] = `"socket"`
		rt := nettest.NewRuntime(t, nettest.Net{Name: "mounts", V4: "192.0.2.96/28", Extra: extra})
		c, err := rt.Add(t, "s1", nettest.Mapping{HostPort: 6400, ContainerPort: srvPort})
		if nettest.Code(err) != 50 || !strings.Contains(err.Error(), "where the node's init sees it") {
			t.Errorf("ADD with the socket path at its default places, from a mount namespace of its own: %v (code %d), want code 50 saying why", err, nettest.Code(err))
		} else {
			t.Logf("refused: %v", err)
		}
		_ = rt.Del(c)
		if after := mounts(t); after != before {
			t.Errorf("the plugin mounted in the runtime's mount namespace:\n%s\nwas:\n%s", after, before)
		}

		autoTakesNAT(t, extra, "mounts-auto", 6401)
		if got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6401)); err != nil || !strings.HasPrefix(got, "a1 sees ") {
			t.Errorf("\"auto\" from the LAN: %q, %v", got, err)
		}
		if after := mounts(t); after != before {
			t.Errorf("\"auto\" mounted in the runtime's mount namespace:\n%s\nwas:\n%s", after, before)
		}
	})
}

// TestSocketPathReadOnlyBPFFS: a bpfPinDir on a bpf filesystem mounted
// read-only (a runtime's sandboxed view of /sys/fs/bpf) gets code 50
// naming it at ADD (from Ready, which STATUS asks too), and "auto" takes
// the NAT path; before, Ready passed and ADD failed pinning.
func TestSocketPathReadOnlyBPFFS(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		site := nettest.NewCgroupSite(t)
		ro := filepath.Join(t.TempDir(), "bpffs-ro")
		if err := os.Mkdir(ro, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("bpffs", ro, "bpf", unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("mount a read-only bpffs: %v", err)
		}
		t.Cleanup(func() { _ = unix.Unmount(ro, unix.MNT_DETACH) })
		extra["localhost"] = `"socket"`
		extra["cgroupPath"] = fmt.Sprintf("%q", site.Cgroup)
		extra["bpfPinDir"] = fmt.Sprintf("%q", ro)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "robpf", V4: "192.0.2.96/28", Extra: extra})
		c, err := rt.Add(t, "r1", nettest.Mapping{HostPort: 6410, ContainerPort: srvPort})
		if nettest.Code(err) != 50 || !strings.Contains(err.Error(), "read-only bpf filesystem") {
			t.Errorf("ADD with bpfPinDir on a read-only bpffs: %v (code %d), want code 50 naming it", err, nettest.Code(err))
		}
		_ = rt.Del(c)
		autoTakesNAT(t, extra, "robpf-auto", 6411)
	})
}

// autoTakesNAT adds a container a1 with host port port on a network
// name of the portmap keys extra with "localhost": "auto", where the
// socket path cannot be served, and checks that 127.0.0.1:port reaches
// it all the same: "auto" took the NAT path. The container goes with the
// test.
func autoTakesNAT(t *testing.T, extra map[string]string, name string, port int) {
	t.Helper()
	extra["localhost"] = `"auto"`
	rt := nettest.NewRuntime(t, nettest.Net{Name: name, V4: "192.0.2.112/28", Extra: extra})
	c := rt.MustAdd(t, "a1", nettest.Mapping{HostPort: port, ContainerPort: srvPort})
	t.Cleanup(func() { _ = rt.Del(c) })
	nettest.Serve(t, c.NS, "a1", srvPort)
	if got, err := nettest.Dial(nil, "tcp", addr("127.0.0.1", port)); err != nil || !strings.HasPrefix(got, "a1 sees ") {
		t.Errorf("\"auto\" at 127.0.0.1: %q, %v; want the NAT path", got, err)
	}
}
