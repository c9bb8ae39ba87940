package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/test/nettest"
)

func socketExtra(extra map[string]string, mode string, site *nettest.CgroupSite) map[string]string {
	extra["localhost"] = fmt.Sprintf("%q", mode)
	extra["cgroupPath"] = fmt.Sprintf("%q", site.Cgroup)
	extra["bpfPinDir"] = fmt.Sprintf("%q", site.PinDir)
	return extra
}

// expectSocket dials addr from a client process in the test cgroup and
// wants the container named want, with the peer address the client
// dialled (getpeername, recvfrom).
func expectSocket(t *testing.T, site *nettest.CgroupSite, proto, addr, want string) {
	t.Helper()
	res, err := site.Client(proto, addr, false)
	if err != nil {
		t.Errorf("%s %s: %v", proto, addr, err)
		return
	}
	if !strings.HasPrefix(res.Reply, want+" sees ") {
		t.Errorf("%s %s: reply %q, want %s's", proto, addr, res.Reply, want)
	}
	if res.Peer != addr {
		t.Errorf("%s %s: the socket's peer is %s, want the address dialled", proto, addr, res.Peer)
	}
}

func expectSocketRefused(t *testing.T, site *nettest.CgroupSite, proto, addr string) {
	t.Helper()
	if res, err := site.Client(proto, addr, false); err == nil {
		t.Errorf("%s %s answered %q, want nothing", proto, addr, res.Reply)
	}
}

// routeLocalnetOn lists the interfaces of the test's node namespace with
// route_localnet on, but those of skip (on before the test: other tests
// of this namespace left them).
func routeLocalnetOn(t *testing.T, skip ...string) []string {
	t.Helper()
	files, _ := filepath.Glob("/proc/sys/net/ipv4/conf/*/route_localnet")
	var on []string
	for _, f := range files {
		name := filepath.Base(filepath.Dir(f))
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == "1" && !slices.Contains(skip, name) {
			on = append(on, name)
		}
	}
	return on
}

// ours keeps the lines of a ruleset that name our objects (the ptp
// plugin's masquerade rules are not ours).
func ours(ruleset string) string {
	var out []string
	for _, l := range strings.Split(ruleset, "\n") {
		for _, w := range []string{"HOSTPORT", "CNI-DN-", "dn-", "cni_portmap", "hostport"} {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// The socket path through libcni with the real ptp and host-local, both
// backends: a process on the node reaches the container at 127.0.0.1 and
// [::1] over TCP and UDP, sees the address it dialled, with route_localnet
// off and no DNAT conntrack entry; a remote client still takes the DNAT
// path; another namespace's localhost is its own; a host IP of 127.0.0.1
// is served at that address only; the newest ADD of a port wins and DEL
// of the older keeps it; CHECK; GC; DEL leaves the port refused.
func TestSocketPathE2E(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		site := nettest.NewCgroupSite(t)
		wasOn := routeLocalnetOn(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "sock", CNIVersion: "1.1.0", V4: "192.0.2.64/27", V6: "2001:db8:64::/64",
			Extra: socketExtra(extra, "socket", site)})
		cl := client(t)
		c1 := rt.MustAdd(t, "s1", nettest.Mapping{HostPort: 7900, ContainerPort: srvPort, Protocol: "tcp"},
			nettest.Mapping{HostPort: 7900, ContainerPort: srvPort, Protocol: "udp"})
		nettest.Serve(t, c1.NS, "s1", srvPort)

		_ = exec.Command("conntrack", "-F").Run()
		for _, proto := range []string{"tcp", "udp"} {
			for _, a := range []string{"127.0.0.1:7900", "[::1]:7900"} {
				expectSocket(t, site, proto, a, "s1")
			}
		}
		if on := routeLocalnetOn(t, wasOn...); len(on) != 0 {
			t.Errorf("route_localnet on for %v, want it left off", on)
		}
		out, err := exec.Command("conntrack", "-L", "-g").CombinedOutput()
		if err != nil && !strings.Contains(string(out), "0 flow entries") {
			t.Fatalf("conntrack -L -g: %v\n%s", err, out)
		}
		if strings.Contains(string(out), "dport=7900") {
			t.Errorf("a DNAT conntrack entry for the localhost connections:\n%s", out)
		}
		// remote clients keep the DNAT path
		expectReply(t, cl, "tcp", addr(cl.HostIP[0].String(), 7900), "s1", cl.IP[0].String())
		expectReply(t, cl, "tcp", addr(cl.HostIP[1].String(), 7900), "s1", cl.IP[1].String())
		// another namespace in the same cgroup keeps its own localhost
		if res, err := site.Client("tcp", "127.0.0.1:7900", true); err != nil || res.Reply != "local" {
			t.Errorf("another namespace: %q %v, want its own \"local\"", res.Reply, err)
		}
		if err := rt.Check(c1); err != nil {
			t.Errorf("CHECK: %v", err)
		}

		// a mapping with host IP 127.0.0.1: that address only
		c2 := rt.MustAdd(t, "s2", nettest.Mapping{HostPort: 7901, ContainerPort: srvPort, HostIP: "127.0.0.1"})
		nettest.Serve(t, c2.NS, "s2", srvPort)
		expectSocket(t, site, "tcp", "127.0.0.1:7901", "s2")
		expectSocketRefused(t, site, "tcp", "[::1]:7901")
		expectSocketRefused(t, site, "tcp", "127.0.0.2:7901")

		// the newest ADD of a port wins; DEL of the older keeps it
		c3 := rt.MustAdd(t, "s3", nettest.Mapping{HostPort: 7900, ContainerPort: srvPort, Protocol: "tcp"})
		nettest.Serve(t, c3.NS, "s3", srvPort)
		expectSocket(t, site, "tcp", "127.0.0.1:7900", "s3")
		if err := rt.Del(c1); err != nil {
			t.Fatal(err)
		}
		expectSocket(t, site, "tcp", "127.0.0.1:7900", "s3")
		expectSocket(t, site, "tcp", "[::1]:7900", "s3")
		if err := rt.Check(c3); err != nil {
			t.Errorf("CHECK of the newest: %v", err)
		}

		// GC: s2 is no longer valid
		err = rt.CNI.GCNetworkList(t.Context(), rt.List, &libcni.GCArgs{
			ValidAttachments: []types.GCAttachment{{ContainerID: "s3", IfName: "eth0"}}})
		if err != nil {
			t.Fatalf("GC: %v", err)
		}
		expectSocketRefused(t, site, "tcp", "127.0.0.1:7901")
		expectSocket(t, site, "tcp", "127.0.0.1:7900", "s3")

		if err := rt.Del(c3); err != nil {
			t.Fatal(err)
		}
		expectSocketRefused(t, site, "tcp", "127.0.0.1:7900")
		expectSocketRefused(t, site, "tcp", "[::1]:7900")
	})
}

// A host that cannot serve the socket path: "socket" fails ADD with code
// 50 naming what is missing and changes nothing; "auto" falls back to
// NAT (route_localnet on, 127.0.0.1 DNATed).
func TestSocketPathUnavailable(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		site := &nettest.CgroupSite{Cgroup: "/nonexistent/cgroup", PinDir: t.TempDir() + "/pins"}
		before, wasOn := ours(b.ruleset(t)), routeLocalnetOn(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "nosock", V4: "192.0.2.96/28", Extra: socketExtra(extra, "socket", site)})
		c1, err := rt.Add(t, "n1", nettest.Mapping{HostPort: 7910, ContainerPort: srvPort})
		if err == nil || nettest.Code(err) != 50 || !strings.Contains(err.Error(), "/nonexistent/cgroup") {
			t.Fatalf("ADD with an unusable cgroupPath: %v (code %d), want code 50 naming it", err, nettest.Code(err))
		}
		if after := ours(b.ruleset(t)); after != before {
			t.Errorf("the failed ADD changed the ruleset:\n%s\nwas:\n%s", after, before)
		}
		if err := rt.Del(c1); err != nil { // as a runtime does after a failed ADD
			t.Fatal(err)
		}
		if on := routeLocalnetOn(t, wasOn...); len(on) != 0 {
			t.Errorf("the failed ADD turned route_localnet on for %v", on)
		}

		rt = nettest.NewRuntime(t, nettest.Net{Name: "auto", V4: "192.0.2.112/28", Extra: socketExtra(extra, "auto", site)})
		c := rt.MustAdd(t, "n2", nettest.Mapping{HostPort: 7911, ContainerPort: srvPort})
		nettest.Serve(t, c.NS, "n2", srvPort)
		if on := routeLocalnetOn(t, wasOn...); len(on) == 0 {
			t.Error("\"auto\" on a host without the socket path did not fall back to NAT (route_localnet off)")
		}
		expectReply(t, nil, "tcp", "127.0.0.1:7911", "n2", "")
	})
}

// listEntries is `portmap-agent list --json args...`: the node's host-port
// table.
func listEntries(t *testing.T, args ...string) []inventory.Entry {
	t.Helper()
	args = append([]string{"list", "--json"}, args...)
	out, stderr, status, err := nettest.Agent(args...)
	if err != nil || status != 0 {
		t.Fatalf("portmap %v: exit %d %v\n%s", args, status, err, stderr)
	}
	var entries []inventory.Entry
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("portmap-agent list --json: %v\n%s", err, out)
	}
	return entries
}

// listSocket is `portmap-agent list --json --bpf-pin-dir DIR`'s socket-path
// entries, as "hostIP port/proto containerIP containerID" (a host IP of
// "*" is the wildcard mapping: 127.0.0.1 or ::1 by the family).
func listSocket(t *testing.T, pinDir string) []string {
	t.Helper()
	var args []string
	if pinDir != "" {
		args = append(args, "--bpf-pin-dir", pinDir)
	}
	entries := listEntries(t, args...)
	var got []string
	for _, e := range entries {
		if e.Backend == "localhost" {
			got = append(got, fmt.Sprintf("%s %d/%s %s %s", e.HostIP, e.HostPort, e.Protocol, e.ContainerIP, e.ContainerID))
		}
	}
	slices.Sort(got)
	return got
}

// The socket path operated like the rules: STATUS asks it; `portmap
// list` shows its entries; `portmap-agent sync` (the agent) repairs a link
// removed behind its back; `portmap-agent sync --prune` retires the site once
// the last container is gone — nothing pinned, nothing of ours attached
// — and not before.
func TestSocketPathOperate(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		site := nettest.NewCgroupSite(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "sockop", CNIVersion: "1.1.0", V4: "192.0.2.128/27", V6: "2001:db8:128::/64",
			Extra: socketExtra(extra, "socket", site)})
		if err := rt.CNI.GetStatusNetworkList(t.Context(), rt.List); err != nil {
			t.Errorf("STATUS: %v", err)
		}
		bad := nettest.NewRuntime(t, nettest.Net{Name: "sockbad", CNIVersion: "1.1.0", V4: "192.0.2.160/27",
			Extra: socketExtra(maps.Clone(extra), "socket", &nettest.CgroupSite{Cgroup: "/nonexistent/cgroup", PinDir: site.PinDir})})
		if err := bad.CNI.GetStatusNetworkList(t.Context(), bad.List); nettest.Code(err) != 50 || !strings.Contains(err.Error(), "/nonexistent/cgroup") {
			t.Errorf("STATUS with an unusable cgroupPath: %v (code %d), want code 50 naming it", err, nettest.Code(err))
		}

		c1 := rt.MustAdd(t, "o1", nettest.Mapping{HostPort: 7920, ContainerPort: srvPort, Protocol: "tcp"},
			nettest.Mapping{HostPort: 7920, ContainerPort: srvPort, Protocol: "udp"})
		nettest.Serve(t, c1.NS, "o1", srvPort)
		var want []string
		for _, f := range []int{4, 6} {
			for _, proto := range []string{"tcp", "udp"} {
				want = append(want, fmt.Sprintf("* 7920/%s %s o1", proto, c1.IP(f)))
			}
		}
		slices.Sort(want)
		if got := listSocket(t, site.PinDir); !slices.Equal(got, want) {
			t.Errorf("portmap-agent list --bpf-pin-dir: %q, want %q", got, want)
		}
		if got := listSocket(t, ""); len(got) != 0 {
			t.Errorf("portmap-agent list shows another site's entries at the default one: %q", got)
		}

		// a link removed behind its back: the agent puts it back
		if err := os.Remove(filepath.Join(site.PinDir, "v1", "connect4")); err != nil {
			t.Fatal(err)
		}
		expectSocketRefused(t, site, "tcp", "127.0.0.1:7920")
		if err := rt.Check(c1); err == nil || !strings.Contains(err.Error(), "connect4 missing") {
			t.Errorf("CHECK without the connect4 link: %v", err)
		}
		rep, status := runSync(t, "--cache-dir", rt.CacheDir)
		if status != 0 || len(rep.Shared) != 1 || rep.Shared[0].Backend != "localhost" || !strings.Contains(rep.Shared[0].What, "connect4 missing") {
			t.Errorf("sync: exit %d, shared %+v, want the connect4 link repaired", status, rep.Shared)
		}
		if err := rt.Check(c1); err != nil {
			t.Errorf("CHECK after sync: %v", err)
		}
		expectSocket(t, site, "tcp", "127.0.0.1:7920", "o1")

		// retired only when no entry remains
		rep, status = runSync(t, "--prune", "--cache-dir", rt.CacheDir, "--bpf-pin-dir", site.PinDir)
		if status != 0 || len(rep.Removed) != 0 {
			t.Errorf("sync --prune with a container: exit %d, removed %+v", status, rep.Removed)
		}
		expectSocket(t, site, "tcp", "[::1]:7920", "o1")
		if err := rt.Del(c1); err != nil {
			t.Fatal(err)
		}
		rep, status = runSync(t, "--prune", "--cache-dir", rt.CacheDir, "--bpf-pin-dir", site.PinDir)
		if status != 0 || len(rep.Removed) != 1 || rep.Removed[0].Backend != "localhost" {
			t.Errorf("sync --prune after the last DEL: exit %d, removed %+v, want the socket path", status, rep.Removed)
		}
		if _, err := os.Stat(site.PinDir); !os.IsNotExist(err) {
			t.Errorf("the pin directory is still there after the site was retired: %v", err)
		}
		cg, err := os.Open(site.Cgroup)
		if err != nil {
			t.Fatal(err)
		}
		defer cg.Close()
		for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect,
			ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCgroupInet4GetPeername} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: at})
			if err != nil || len(res.Programs) != 0 {
				t.Errorf("after retire, %v programs on the cgroup: %+v %v", at, res, err)
			}
		}
		if got := listSocket(t, site.PinDir); len(got) != 0 {
			t.Errorf("portmap-agent list after retire: %q", got)
		}
		// the next ADD installs it again
		c2 := rt.MustAdd(t, "o2", nettest.Mapping{HostPort: 7921, ContainerPort: srvPort, Protocol: "tcp"})
		nettest.Serve(t, c2.NS, "o2", srvPort)
		expectSocket(t, site, "tcp", "127.0.0.1:7921", "o2")
		if err := rt.Del(c2); err != nil {
			t.Fatal(err)
		}
	})
}
