package nodesafety

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
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

// runtimeIn is a runtime that runs the plugin through script (a shell
// script whose "$@" is the plugin's path and arguments): a runtime with
// a mount namespace of its own.
func runtimeIn(t *testing.T, net nettest.Net, script string) *nettest.Runtime {
	t.Helper()
	dir := t.TempDir()
	wrapper := fmt.Sprintf("#!/bin/sh\nset -- %q \"$@\"\n%s\n", filepath.Join(nettest.BinDir(), "portmap"), script)
	if err := os.WriteFile(filepath.Join(dir, "portmap"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	rt := nettest.NewRuntime(t, net)
	rt.CNI = libcni.NewCNIConfigWithCacheDir([]string{dir, nettest.BinDir()}, rt.CacheDir, nil)
	return rt
}

// TestSocketPathMountsNothingPrivate: a runtime that calls the plugin
// from a mount namespace of its own (a copy of the node's, whose /sys is
// a sysfs of the test's: no bpf filesystem at /sys/fs/bpf, no cgroup v2
// hierarchy) and wants the socket path at its default places gets code
// 50 naming what is missing and why, and nothing is mounted: a bpf
// filesystem mounted there would die with the runtime's namespace, and
// the links pinned in it. "auto" takes the NAT path instead.
func TestSocketPathMountsNothingPrivate(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		cl := lan(t)
		before := mounts(t)
		extra["localhost"] = `"socket"`
		rt := runtimeIn(t, nettest.Net{Name: "mounts", V4: "192.0.2.96/28", Extra: extra}, `exec unshare --mount -- "$@"`)
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

		autoTakesNAT(t, extra, "mounts-auto", 6401, `exec unshare --mount -- "$@"`)
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
		autoTakesNAT(t, extra, "robpf-auto", 6411, `exec "$@"`)
	})
}

// TestSocketPathPrivateBPFFS: a runtime whose mount namespace has a bpf
// filesystem of its own (mounted there, not in the node's) and a
// bpfPinDir on it gets code 50 naming it at ADD, since the pins would
// die with the runtime's namespace and the links with them; the same
// runtime with bpfPinDir on the node's bpf filesystem, seen through its
// namespace, is served (127.0.0.1 reaches the container through the
// socket path), and "auto" takes the NAT path where the socket path is
// refused.
func TestSocketPathPrivateBPFFS(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		site := nettest.NewCgroupSite(t)
		private := filepath.Join(t.TempDir(), "runtime-bpffs")
		if err := os.Mkdir(private, 0o700); err != nil {
			t.Fatal(err)
		}
		extra["localhost"] = `"socket"`
		extra["cgroupPath"] = fmt.Sprintf("%q", site.Cgroup)
		extra["bpfPinDir"] = fmt.Sprintf("%q", filepath.Join(private, "cni-portmap"))
		own := fmt.Sprintf(`exec unshare --mount -- sh -c 'mount -t bpf bpffs %q && exec "$@"' sh "$@"`, private)
		rt := runtimeIn(t, nettest.Net{Name: "privbpf", V4: "192.0.2.96/28", Extra: extra}, own)
		c, err := rt.Add(t, "p1", nettest.Mapping{HostPort: 6420, ContainerPort: srvPort})
		if nettest.Code(err) != 50 || !strings.Contains(err.Error(), "the node's init does not see") || !strings.Contains(err.Error(), private) {
			t.Errorf("ADD with bpfPinDir on the runtime's own bpffs: %v (code %d), want code 50 naming it", err, nettest.Code(err))
		} else {
			t.Logf("refused: %v", err)
		}
		_ = rt.Del(c)

		// the node's bpffs, seen from the runtime's namespace
		extra["bpfPinDir"] = fmt.Sprintf("%q", site.PinDir)
		rt = runtimeIn(t, nettest.Net{Name: "nodebpf", V4: "192.0.2.112/28", Extra: extra}, `exec unshare --mount -- "$@"`)
		c = rt.MustAdd(t, "n1", nettest.Mapping{HostPort: 6421, ContainerPort: srvPort})
		t.Cleanup(func() { _ = rt.Del(c) })
		nettest.Serve(t, c.NS, "n1", srvPort)
		if res, err := site.Client("tcp", addr("127.0.0.1", 6421), false); err != nil || !strings.HasPrefix(res.Reply, "n1 sees ") {
			t.Errorf("127.0.0.1:6421 through the socket path on the node's bpffs: %+v %v", res, err)
		}

		extra["bpfPinDir"] = fmt.Sprintf("%q", filepath.Join(private, "cni-portmap"))
		extra["localhost"] = `"auto"`
		rt = runtimeIn(t, nettest.Net{Name: "privbpf-auto", V4: "192.0.2.128/28", Extra: extra}, own)
		a := rt.MustAdd(t, "a1", nettest.Mapping{HostPort: 6422, ContainerPort: srvPort})
		t.Cleanup(func() { _ = rt.Del(a) })
		nettest.Serve(t, a.NS, "a1", srvPort)
		if got, err := nettest.Dial(nil, "tcp", addr("127.0.0.1", 6422)); err != nil || !strings.HasPrefix(got, "a1 sees ") {
			t.Errorf("\"auto\" with bpfPinDir on the runtime's own bpffs at 127.0.0.1: %q, %v; want the NAT path", got, err)
		}
	})
}

// autoTakesNAT adds a container a1 with host port port on a network
// name of the portmap keys extra with "localhost": "auto", where the
// socket path cannot be served, through a runtime that runs the plugin
// with script (runtimeIn), and checks that 127.0.0.1:port reaches it
// all the same: "auto" took the NAT path. The container goes with the
// test.
func autoTakesNAT(t *testing.T, extra map[string]string, name string, port int, script string) {
	t.Helper()
	extra["localhost"] = `"auto"`
	rt := runtimeIn(t, nettest.Net{Name: name, V4: "192.0.2.112/28", Extra: extra}, script)
	c := rt.MustAdd(t, "a1", nettest.Mapping{HostPort: port, ContainerPort: srvPort})
	t.Cleanup(func() { _ = rt.Del(c) })
	nettest.Serve(t, c.NS, "a1", srvPort)
	if got, err := nettest.Dial(nil, "tcp", addr("127.0.0.1", port)); err != nil || !strings.HasPrefix(got, "a1 sees ") {
		t.Errorf("\"auto\" at 127.0.0.1: %q, %v; want the NAT path", got, err)
	}
}
