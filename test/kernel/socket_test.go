package kernel

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/backend/socket"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nfnl"
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
		Mappings:     plan.MappingsOf(ms...), Localhost: plan.LocalhostSocket,
		Socket: plan.Socket{CgroupPath: site.Cgroup, PinDir: site.PinDir}}
}

// The programs on the real kernel: TCP and UDP to 127.0.0.1, [::1] and
// [::ffff:127.0.0.1] reach the container; getpeername and recvfrom give
// back the address dialled; a client in another namespace is not
// rewritten; DEL takes it all back.
// socketKernel skips a test of the socket path's workings on a kernel
// before 5.14, which has no namespace cookie from a socket
// (SO_NETNS_COOKIE): the socket path is refused there, which TestSocketPath
// checks.
func socketKernel(t *testing.T) {
	t.Helper()
	if !nfnl.ReleaseAtLeast(nfnl.Release(), 5, 14) {
		t.Skipf("Linux %s: the socket path needs 5.14 and is refused here (TestSocketPath)", nfnl.Release())
	}
}

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
		err = l.Ready(p)
		if !nfnl.ReleaseAtLeast(nfnl.Release(), 5, 14) {
			// the namespace's cookie from a socket (SO_NETNS_COOKIE)
			// came in 5.14: the socket path says so, and is not served
			if err == nil || !strings.Contains(err.Error(), "Linux 5.14") {
				t.Fatalf("ready on a kernel before 5.14: %v, want the feature and its release named", err)
			}
			return
		}
		if err != nil {
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

// programNames are the names of the programs pinned beside the site's
// links, sorted.
func programNames(t *testing.T, pinDir string) string {
	t.Helper()
	pins, _ := filepath.Glob(filepath.Join(pinDir, socket.Layout, "prog_*"))
	var names []string
	for _, pin := range pins {
		p, err := ebpf.LoadPinnedProgram(pin, nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, info.Name)
	}
	slices.Sort(names)
	return strings.Join(names, " ")
}

// The lifecycle on the real kernel: CHECK fails when a link's pin or an
// entry is removed behind its back, sync repairs both; another build's
// programs are replaced in place while a client dials without a failure;
// DEL leaves 127.0.0.1 refused, and removing the site leaves nothing.
func TestSocketPathLifecycle(t *testing.T) {
	socketKernel(t)
	site := nettest.NewCgroupSite(t)
	cfg := plan.Socket{CgroupPath: site.Cgroup, PinDir: site.PinDir}
	c := socketContainer(t, "sk1", "198.51.101", "2001:db8:52:", "ctr")
	p := socketPlan(plan.IPv4, c, site, "c1", plan.Mapping{HostPort: 18081, ContainerPort: 80, Protocol: plan.TCP})

	// an older build left its programs: ADD updates them in place
	if err := socket.InstallBuild(cfg, socket.Revision-1, "000000"); err != nil {
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
		if err := socket.InstallBuild(cfg, socket.Revision-1, "111111"); err != nil {
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

	// a newer revision's programs (the other side of a rolling update):
	// CHECK passes and ADD leaves them, so the two builds do not rewrite
	// each other's on every ADD and pass
	if err := socket.InstallBuild(cfg, socket.Revision+1, "222222"); err != nil {
		t.Fatal(err)
	}
	newer := programNames(t, site.PinDir)
	if err := l.Check(p); err != nil {
		t.Errorf("CHECK with a newer revision's programs: %v", err)
	}
	if err := l.Apply(p); err != nil {
		t.Fatal(err)
	}
	if got := programNames(t, site.PinDir); got != newer || !strings.Contains(got, fmt.Sprintf("_%02d_222222", socket.Revision+1)) {
		t.Errorf("ADD beside a newer revision's programs: %s, were %s; want them left", got, newer)
	}
	if _, err := site.Client("tcp", "127.0.0.1:18081", false); err != nil {
		t.Errorf("127.0.0.1:18081 through a newer revision's programs: %v", err)
	}
	if err := socket.InstallBuild(cfg, socket.Revision, socket.Version()); err != nil {
		t.Fatal(err)
	}

	// a link's pin removed: the program is detached
	if err := os.Remove(filepath.Join(site.PinDir, socket.Layout, "connect4")); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(p); err == nil || !strings.Contains(err.Error(), "connect4 missing") {
		t.Errorf("CHECK without the connect4 link: %v", err)
	}
	// The kernel releases a link whose last pin is gone in deferred work
	// (after an RCU grace period), so the program stays attached for a
	// moment: Retire detaches before it unpins; an operator's rm does not.
	if !nettest.Eventually(5*time.Second, func() bool {
		_, err := site.Client("tcp", "127.0.0.1:18081", false)
		return err != nil
	}) {
		t.Error("127.0.0.1 still reached the container 5 s after the connect4 link's pin was removed")
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

// foreignCounter attaches, through a link of its own, a connect4 program
// that counts the connect() calls it sees in an array map and allows
// them: another tool's program multi-attached to the same cgroup.
func foreignCounter(t *testing.T, cgroup string) (count func() uint64) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect, License: "GPL",
		Instructions: asm.Instructions{
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
			asm.Return(),
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupInet4Connect, Program: prog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return func() uint64 {
		var n uint64
		if err := m.Lookup(uint32(0), &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// attachedIDs lists the programs attached to the cgroup for connect4.
func attachedIDs(t *testing.T, cgroup string) []ebpf.ProgramID {
	t.Helper()
	res, err := link.QueryPrograms(link.QueryOptions{Target: cgroupFD(t, cgroup), Attach: ebpf.AttachCGroupInet4Connect})
	if err != nil {
		t.Fatal(err)
	}
	var ids []ebpf.ProgramID
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	return ids
}

func cgroupFD(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// Another tool's program on the same cgroup keeps running beside ours
// (both see every connect()), and retiring the site detaches ours only;
// a site with an entry left is not retired.
func TestSocketPathCoexists(t *testing.T) {
	socketKernel(t)
	site := nettest.NewCgroupSite(t)
	cfg := plan.Socket{CgroupPath: site.Cgroup, PinDir: site.PinDir}
	count := foreignCounter(t, site.Cgroup)
	foreign := attachedIDs(t, site.Cgroup)
	if len(foreign) != 1 {
		t.Fatalf("the foreign program is not attached: %v", foreign)
	}
	c := socketContainer(t, "sk2", "198.51.102", "2001:db8:53:", "ctr")
	l, err := socket.New(plan.IPv4, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := socketPlan(plan.IPv4, c, site, "c1", plan.Mapping{HostPort: 18082, ContainerPort: 80, Protocol: plan.TCP})
	if err := l.Apply(p); err != nil {
		t.Fatal(err)
	}
	if ids := attachedIDs(t, site.Cgroup); len(ids) != 2 {
		t.Errorf("connect4 programs on the cgroup: %v, want the foreign one and ours", ids)
	}
	before := count()
	if res, err := site.Clients("tcp", "127.0.0.1:18082", false, 5); err != nil || !strings.HasPrefix(res.Reply, "ctr") {
		t.Fatalf("through the socket path beside a foreign program: %+v %v", res, err)
	}
	if n := count() - before; n != 5 {
		t.Errorf("the foreign program saw %d of 5 connect() calls", n)
	}
	if what, err := l.Retire(); err != nil || what != "" {
		t.Fatalf("retired with an entry left: %q %v", what, err)
	}
	if err := l.Remove(p); err != nil {
		t.Fatal(err)
	}
	if what, err := l.Retire(); err != nil || what == "" {
		t.Fatalf("retire of an empty site: %q %v", what, err)
	}
	if ids := attachedIDs(t, site.Cgroup); len(ids) != 1 || ids[0] != foreign[0] {
		t.Errorf("after retire: connect4 programs %v, want the foreign one (%v) only", ids, foreign)
	}
	ents, err := os.ReadDir(site.BPFFS)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".debug") { // the kernel's own iterators
			t.Errorf("after retire the bpffs holds %s, want nothing of ours", e.Name())
		}
	}
}

// The known limit of the socket path (as of every connect-time
// rewrite): a connected UDP socket was pointed at a container when it
// connected, and keeps sending there after a newer container takes the
// port and after the older one's DEL. The conntrack flush of ADD cannot
// help: these datagrams never met NAT. New sockets go to the newest.
func TestSocketPathConnectedUDP(t *testing.T) {
	socketKernel(t)
	site := nettest.NewCgroupSite(t)
	cfg := plan.Socket{CgroupPath: site.Cgroup, PinDir: site.PinDir}
	a := socketContainer(t, "sk3", "198.51.103", "2001:db8:54:", "a")
	b := socketContainer(t, "sk4", "198.51.104", "2001:db8:55:", "b")
	l, err := socket.New(plan.IPv4, cfg)
	if err != nil {
		t.Fatal(err)
	}
	u := plan.Mapping{HostPort: 18083, ContainerPort: 80, Protocol: plan.UDP}
	pa, pb := socketPlan(plan.IPv4, a, site, "a", u), socketPlan(plan.IPv4, b, site, "b", u)
	if err := l.Apply(pa); err != nil {
		t.Fatal(err)
	}
	defer l.Remove(pa)
	s, err := site.ConnectedUDP("127.0.0.1:18083")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ask := func(when, want string) {
		t.Helper()
		if got, err := s.Ask(); err != nil || !strings.HasPrefix(got, want+" sees ") {
			t.Errorf("connected socket %s: %q %v, want %s's reply", when, got, err, want)
		}
	}
	ask("at first", "a")
	if err := l.Apply(pb); err != nil {
		t.Fatal(err)
	}
	defer l.Remove(pb)
	ask("after b took the port", "a")
	if err := l.Remove(pa); err != nil {
		t.Fatal(err)
	}
	ask("after a's DEL", "a")
	if res, err := site.Client("udp", "127.0.0.1:18083", false); err != nil || !strings.HasPrefix(res.Reply, "b sees ") {
		t.Errorf("a new socket: %+v %v, want b's reply", res, err)
	}
}

// With the default cgroupPath and no cgroup v2 hierarchy in reach (this
// test's mount namespace has a sysfs of its own over the host's cgroup
// mounts), the socket path mounts the hierarchy itself, once; later
// lookups find that mount. Nothing is attached here.
func TestSocketPathMountsCgroup2(t *testing.T) {
	at := filepath.Join(t.TempDir(), "cgroupv2")
	got, err := socket.HostCgroup2(at)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(at, unix.MNT_DETACH) })
	if got != at {
		t.Fatalf("a cgroup v2 hierarchy is in reach at %s: this test needs none", got)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(at, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Fatalf("%s after the mount: type %#x %v, want cgroup2", at, st.Type, err)
	}
	if _, err := os.Stat(filepath.Join(at, "cgroup.procs")); err != nil {
		t.Errorf("the mount is not a cgroup v2 root: %v", err)
	}
	again, err := socket.HostCgroup2(filepath.Join(t.TempDir(), "other"))
	if err != nil || again != at {
		t.Errorf("second lookup: %q %v, want the first mount %s", again, err, at)
	}
}
