package kernel

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"

	"github.com/portmap-dev/portmap/pkg/backend/socket"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

// socketContainer is a namespace with a server on port 80 at
// 198.51.100.2 and 2001:db8:51::2, linked to the test's node namespace.
func socketContainer(t *testing.T, hostIf, v4, v6, name string) *nettest.Client {
	t.Helper()
	c := nettest.NewClient(t, nettest.ClientNet{HostIf: hostIf, V4: v4, V6: v6})
	nettest.Serve(t, c.NS, name, 80)
	return c
}

func socketPlan(f plan.Family, c *nettest.Client, site *nettest.CgroupSite, id string, ms ...plan.Mapping) *plan.Plan {
	i := 0
	bits := 24
	if f == plan.IPv6 {
		i, bits = 1, 64
	}
	return &plan.Plan{Family: f, Owner: plan.Owner{Network: "net1", ContainerID: id, IfName: "eth0"},
		ContainerNet: &net.IPNet{IP: c.IP[i], Mask: net.CIDRMask(bits, 8*len(c.IP[i].To16()))},
		Mappings:     ms, Localhost: plan.LocalhostSocket,
		Socket: plan.Socket{CgroupPath: site.Cgroup, PinDir: site.PinDir}}
}

// The programs on the real kernel: TCP and UDP to 127.0.0.1, [::1] and
// [::ffff:127.0.0.1] reach the container; getpeername and recvfrom give
// back the address dialled; a client in another namespace is not
// rewritten; DEL takes it all back.
func TestSocketPath(t *testing.T) {
	site := nettest.NewCgroupSite(t)
	c := socketContainer(t, "sk0", "198.51.100", "2001:db8:51:", "ctr")
	m := plan.Mapping{HostPort: 18080, ContainerPort: 80, Protocol: plan.TCP}
	u := plan.Mapping{HostPort: 18080, ContainerPort: 80, Protocol: plan.UDP}
	var plans []*plan.Plan
	for _, f := range plan.Families {
		l, err := socket.New(f, plan.Socket{CgroupPath: site.Cgroup, PinDir: site.PinDir})
		if err != nil {
			t.Fatal(err)
		}
		p := socketPlan(f, c, site, "c1", m, u)
		if err := l.Ready(p); err != nil {
			t.Fatalf("ready: %v", err)
		}
		if err := l.Apply(p); err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
		if err := l.Check(p); err != nil {
			t.Fatalf("check %s: %v", f, err)
		}
		plans = append(plans, p)
		defer l.Remove(p)
	}
	for _, tc := range []struct{ proto, addr, peer string }{
		{"tcp", "127.0.0.1:18080", "127.0.0.1:18080"},
		{"tcp", "[::1]:18080", "[::1]:18080"},
		{"tcp", "[::ffff:127.0.0.1]:18080", "[::ffff:127.0.0.1]:18080"},
		{"udp", "127.0.0.1:18080", "127.0.0.1:18080"},
		{"udp", "[::1]:18080", "[::1]:18080"},
	} {
		res, err := site.Client(tc.proto, tc.addr, false)
		if err != nil {
			t.Errorf("%s %s: %v", tc.proto, tc.addr, err)
			continue
		}
		if !strings.HasPrefix(res.Reply, "ctr sees ") {
			t.Errorf("%s %s: reply %q, want the container's", tc.proto, tc.addr, res.Reply)
		}
		if res.Peer != tc.peer && !(tc.proto == "udp" && strings.Contains(tc.peer, "::ffff:")) {
			t.Errorf("%s %s: peer %q, want %q (the address dialled)", tc.proto, tc.addr, res.Peer, tc.peer)
		}
	}
	// another network namespace in the same cgroup: its own localhost
	res, err := site.Client("tcp", "127.0.0.1:18080", true)
	if err != nil || res.Reply != "local" {
		t.Errorf("other netns: %q, %v; want its own server's \"local\"", res.Reply, err)
	}
}

// The lifecycle on the real kernel: CHECK fails when a link's pin or an
// entry is removed behind its back, sync repairs both; another build's
// programs are replaced in place while a client dials without a failure;
// DEL leaves 127.0.0.1 refused, and removing the site leaves nothing.
func TestSocketPathLifecycle(t *testing.T) {
	site := nettest.NewCgroupSite(t)
	cfg := plan.Socket{CgroupPath: site.Cgroup, PinDir: site.PinDir}
	c := socketContainer(t, "sk1", "198.51.101", "2001:db8:52:", "ctr")
	p := socketPlan(plan.IPv4, c, site, "c1", plan.Mapping{HostPort: 18081, ContainerPort: 80, Protocol: plan.TCP})

	// an older build left its programs: ADD updates them in place
	if err := socket.InstallBuild(cfg, "00000000"); err != nil {
		t.Fatal(err)
	}
	l, err := socket.New(plan.IPv4, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(p); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Errorf("CHECK with another build's programs: %v", err)
	}
	if err := l.Apply(p); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(p); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}

	// upgrade under load: while a client dials 1000 new connections,
	// another build's programs and this build's replace each other in
	// place, round after round
	before := pinnedLinks(t, site.PinDir)
	done := make(chan error, 1)
	go func() {
		_, err := site.Clients("tcp", "127.0.0.1:18081", false, 1000)
		done <- err
	}()
	rounds := 0
	for finished := false; !finished; {
		if err := socket.InstallBuild(cfg, "11111111"); err != nil {
			t.Fatal(err)
		}
		if err := l.Check(p); err == nil {
			t.Fatal("CHECK passed with another build's programs")
		}
		if err := l.Apply(p); err != nil {
			t.Fatal(err)
		}
		rounds++
		select {
		case err := <-done:
			finished = true
			if err != nil {
				t.Errorf("a connection failed during the upgrade (round %d): %v", rounds, err)
			}
		default:
		}
	}
	if rounds < 3 {
		t.Errorf("only %d upgrade rounds ran while the client dialled", rounds)
	}
	t.Logf("%d upgrade rounds under 1000 connections", rounds)
	if after := pinnedLinks(t, site.PinDir); strings.Join(after, " ") != strings.Join(before, " ") {
		t.Errorf("links changed across updates: %v → %v", before, after)
	}

	// a link's pin removed: the program is detached
	if err := os.Remove(filepath.Join(site.PinDir, socket.Layout, "connect4")); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(p); err == nil || !strings.Contains(err.Error(), "connect4 missing") {
		t.Errorf("CHECK without the connect4 link: %v", err)
	}
	if _, err := site.Client("tcp", "127.0.0.1:18081", false); err == nil {
		t.Error("127.0.0.1 still reached the container without the connect4 link")
	}
	rep, err := l.Sync([]*plan.Plan{p}, converge.Options{})
	if err != nil || len(rep.Shared) != 1 {
		t.Fatalf("sync: %+v %v", rep, err)
	}
	if err := l.Check(p); err != nil {
		t.Errorf("CHECK after sync: %v", err)
	}
	if res, err := site.Client("tcp", "127.0.0.1:18081", false); err != nil || !strings.HasPrefix(res.Reply, "ctr") {
		t.Errorf("after sync: %+v %v", res, err)
	}

	// an entry removed
	if err := l.GC("net1", nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(p); err == nil || !strings.Contains(err.Error(), "no entry for 127.0.0.1:18081/tcp") {
		t.Errorf("CHECK without the entry: %v", err)
	}
	if rep, err := l.Sync([]*plan.Plan{p}, converge.Options{}); err != nil || rep.Results[0].State != converge.Repaired {
		t.Fatalf("sync: %+v %v", rep, err)
	}
	if err := l.Check(p); err != nil {
		t.Errorf("CHECK after sync: %v", err)
	}

	// DEL: refused again
	if err := l.Remove(p); err != nil {
		t.Fatal(err)
	}
	if res, err := site.Client("tcp", "127.0.0.1:18081", false); err == nil {
		t.Errorf("after DEL 127.0.0.1 still answers: %+v", res)
	}
	if err := socket.Uninstall(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(site.PinDir); !os.IsNotExist(err) {
		t.Errorf("pin directory left after Uninstall: %v", err)
	}
}

// pinnedLinks names each pin with its link's ID: an update in place
// keeps the links.
func pinnedLinks(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, h := range socket.Hooks {
		l, err := link.LoadPinnedLink(filepath.Join(dir, socket.Layout, h.Name), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s=%d", h.Name, info.ID))
	}
	return out
}
