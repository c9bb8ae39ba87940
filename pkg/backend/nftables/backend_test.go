package nftables

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"golang.org/x/sys/unix"
)

// The fake kernel of sync_test.go answers listings of the canned table
// (net1/a, net1/b and old/o) and records the transactions, failing those
// the test says: the verbs' branches, without root.

func lockedBackend(t *testing.T, listed bool, fail func(string) bool) (*Backend, *fakeKernel, *bytes.Buffer, *int) {
	t.Helper()
	b, k := syncBackend(t, listed)
	k.fail = fail
	log := &bytes.Buffer{}
	locks := 0
	b.Log = log
	b.Lock = func() (func(), error) { locks++; return func() {}, nil }
	return b, k, log, &locks
}

func failing(substr string) func(string) bool {
	return func(s string) bool { return strings.Contains(s, substr) }
}

func TestApplyFastPath(t *testing.T) {
	b, k, _, locks := lockedBackend(t, true, nil)
	c, _, _ := syncPlans("192.0.2.7")
	c.Owner.ContainerID = "new"
	c.Mappings = plan.MappingsOf(plan.Mapping{HostPort: 8081, ContainerPort: 80, Protocol: plan.TCP})
	withFlatSkeleton(k, 24, 32)
	if err := b.Apply(c); err != nil {
		t.Fatal(err)
	}
	if len(k.scripts) != 1 || *locks != 0 || !strings.Contains(k.scripts[0], "create chain ip cni_portmap "+ChainName(c.Owner)) {
		t.Errorf("scripts %q locks %d: want one transaction, no lock", k.scripts, *locks)
	}
	if err := b.Apply(plan.Build(plan.Request{Owner: c.Owner}, plan.IPv4, nil)); err == nil {
		t.Error("Apply without a container address succeeded")
	}
}

// A flat ADD's fast path reads the shared objects it needs first: with
// the hairpin set of one of its prefix lengths missing (127.0.0.1's /32
// here), or a port held in a verdict map, it writes nothing but the slow
// path's one transaction, which makes the set and takes the port.
func TestApplyFlatReadsFirst(t *testing.T) {
	c, _, _ := syncPlans("192.0.2.7")
	c.Owner.ContainerID = "new"
	for _, tt := range []struct {
		name    string
		port    int
		lengths []int
	}{{"a hairpin set missing", 8081, []int{24}}, {"a port in a verdict map", 8080, []int{24, 32}}} {
		t.Run(tt.name, func(t *testing.T) {
			b, k, _, locks := lockedBackend(t, true, nil)
			withFlatSkeleton(k, tt.lengths...)
			p := *c
			p.Mappings = plan.MappingsOf(plan.Mapping{HostPort: tt.port, ContainerPort: 80, Protocol: plan.TCP})
			if err := b.Apply(&p); err != nil {
				t.Fatal(err)
			}
			if len(k.scripts) != 1 || *locks != 1 || !strings.Contains(k.scripts[0], "add table") ||
				!strings.Contains(k.scripts[0], "add set ip cni_portmap hairpin_32") {
				t.Errorf("scripts %q, %d locks: want the slow path's one transaction", k.scripts, *locks)
			}
		})
	}
}

// A range's ADD reads what shares its ports under the lock, then
// writes as the fast path does, creating its chain beside the skeleton,
// with no read of its own chain; an ADD again, its chain there, writes
// the slow way (the skeleton and its chain rewritten).
func TestApplyRange(t *testing.T) {
	r := rangePlan("new", "192.0.2.7/24", [2]int{20000, 20099})
	b, k, _, locks := lockedBackend(t, true, nil)
	if err := b.Apply(r); err != nil {
		t.Fatal(err)
	}
	own := ChainName(r.Owner)
	if len(k.scripts) != 1 || *locks != 1 || k.chainReads != 0 || !strings.Contains(k.scripts[0], "create chain ip cni_portmap "+own) ||
		!strings.Contains(k.scripts[0], "20000-20099") {
		t.Errorf("scripts %q, %d locks, %d reads of a chain: want one transaction creating %s, under the lock, no chain read", k.scripts, *locks, k.chainReads, own)
	}

	b, k, _, _ = lockedBackend(t, true, failing("create chain"))
	if err := b.Apply(r); err != nil {
		t.Fatal(err)
	}
	// the slow path reads its own chain and the dispatch chain (the
	// hairpin lengths the skeleton's rewrite keeps)
	if len(k.scripts) != 2 || k.chainReads != 2 || !strings.Contains(k.scripts[1], "flush chain ip cni_portmap "+own) ||
		!strings.Contains(k.scripts[1], "add table ip cni_portmap") {
		t.Errorf("scripts %q, %d reads of a chain: want the slow way after the create failed", k.scripts, k.chainReads)
	}
}

func TestApplyTakesOverNewestWins(t *testing.T) {
	// c (flat) claims a's keys, held in the verdict maps by a's chain of
	// an older layout: the fast path's read finds them, and the slow path
	// deletes them and adds c's elements to the DNAT maps, and logs it.
	c, _, _ := syncPlans("192.0.2.7")
	c.Owner.ContainerID = "c"
	b, k, log, locks := lockedBackend(t, true, nil)
	if err := b.Apply(c); err != nil {
		t.Fatal(err)
	}
	if *locks != 1 || len(k.scripts) != 1 {
		t.Fatalf("scripts %q locks %d", k.scripts, *locks)
	}
	tx, own := k.scripts[0], ChainName(c.Owner)
	for _, w := range []string{
		"delete element ip cni_portmap hostports { tcp . 8080 }",
		"delete element ip cni_portmap hostip_hostports { 198.51.100.1 . udp . 8053 }",
		"add element ip cni_portmap hostport_dnat { tcp . 8080 comment \"" + own + " 192.0.2.0/24 127.0.0.1/32\" : 192.0.2.7 . 80 }",
		"add element ip cni_portmap hostip_hostport_dnat { 198.51.100.1 . udp . 8053 comment \"" + own + " 192.0.2.0/24 127.0.0.1/32\" : 192.0.2.7 . 53 }",
		"add element ip cni_portmap hairpin_24 { 192.0.2.0 . tcp . 8080 comment \"" + own + "\" }",
		"add element ip cni_portmap hairpin_32 { 127.0.0.1 . tcp . 8080 comment \"" + own + "\" }",
		"flush chain ip cni_portmap " + own,
		"add rule ip cni_portmap " + own + " meta l4proto tcp th dport 8080 comment \"record tcp . 8080\"",
		"add element ip cni_portmap owners { " + net.IP(ownerKey(own)).String() + " : goto " + own + " }",
	} {
		if !strings.Contains(tx, w) {
			t.Errorf("slow path lacks %q:\n%s", w, tx)
		}
	}
	if !strings.Contains(log.String(), "tcp . 8080 was forwarded by chain dn-6c270ef2f251d571-a23508c67eab7c80") {
		t.Errorf("takeover not logged: %q", log)
	}
}

func TestReAddDropsStaleKeys(t *testing.T) {
	// a again, without its host-IP mapping: its own stale element goes.
	a, _, _ := syncPlans("192.0.2.2")
	a.Mappings = plan.MappingsOf(a.Mappings.Slice()[:1]...)
	b, k, _, _ := lockedBackend(t, true, failing("create chain"))
	if err := b.Apply(a); err != nil {
		t.Fatal(err)
	}
	last := k.scripts[len(k.scripts)-1]
	if !strings.Contains(last, "delete element ip cni_portmap hostip_hostports { 198.51.100.1 . udp . 8053 }") {
		t.Errorf("re-ADD keeps a stale key:\n%s", last)
	}
}

func TestRemove(t *testing.T) {
	a, _, _ := syncPlans("192.0.2.2")
	t.Run("single ports: one transaction under the lock that adds nothing", func(t *testing.T) {
		// Adding an element with a verdict, even one that is there,
		// makes the kernel validate every chain a verdict map leads to
		// at commit: DEL of single ports reads the elements instead.
		b, k, _, locks := lockedBackend(t, true, nil)
		if err := b.Remove(a); err != nil {
			t.Fatal(err)
		}
		if len(k.scripts) != 1 || *locks != 1 || !strings.Contains(k.scripts[0], "delete chain ip cni_portmap "+ChainName(a.Owner)) ||
			!strings.Contains(k.scripts[0], "delete element ip cni_portmap hostports { tcp . 8080 }") {
			t.Errorf("scripts %q locks %d: want one transaction under the lock", k.scripts, *locks)
		}
		if strings.Contains(k.scripts[0], "add element") {
			t.Errorf("DEL adds an element:\n%s", k.scripts[0])
		}
	})
	t.Run("a key taken over stays with its new owner", func(t *testing.T) {
		// Another attachment took tcp . 8080 over: DEL reads the keys'
		// elements and releases only those still pointing at a's chain,
		// then deletes the chain.
		b, k, _, locks := lockedBackend(t, true, nil)
		own := ChainName(a.Owner)
		k.tables["ip "+Table] = strings.Replace(k.tables["ip "+Table], "tcp . 8080 : goto "+own, "tcp . 8080 : goto dn-other", 1)
		if err := b.Remove(a); err != nil {
			t.Fatal(err)
		}
		last := k.scripts[len(k.scripts)-1]
		if *locks != 1 || len(k.scripts) != 1 || !strings.Contains(last, "delete chain ip cni_portmap "+own) ||
			strings.Contains(last, "tcp . 8080") || !strings.Contains(last, "delete element ip cni_portmap hostip_hostports { 198.51.100.1 . udp . 8053 }") {
			t.Errorf("scripts %q", k.scripts)
		}
	})
	t.Run("without mappings: keys from the chain's comments", func(t *testing.T) {
		b, k, _, _ := lockedBackend(t, true, nil)
		bare := plan.Build(plan.Request{Owner: a.Owner}, plan.IPv4, nil)
		if err := b.Remove(bare); err != nil {
			t.Fatal(err)
		}
		all := strings.Join(k.scripts, "")
		if !strings.Contains(all, "hostports { tcp . 8080 }") || !strings.Contains(all, "hostip_hostports { 198.51.100.1 . udp . 8053 }") {
			t.Errorf("scripts %q: want both keys released", k.scripts)
		}
	})
	t.Run("upstream's rules of the container go too", func(t *testing.T) {
		b, k, _, _ := lockedBackend(t, false, nil)
		k.tables["ip "+UpstreamTable] = "table ip cni_hostport {\n\tchain hostports { # handle 1\n" +
			"\t\ttcp dport 6104 dnat to 192.0.2.66:80 comment \"a\" # handle 4\n\t}\n}\n"
		bare := plan.Build(plan.Request{Owner: a.Owner}, plan.IPv4, nil)
		if err := b.Remove(bare); err != nil {
			t.Fatal(err)
		}
		if len(k.scripts) != 1 || k.scripts[0] != "delete rule ip cni_hostport hostports handle 4\n" {
			t.Errorf("scripts %q", k.scripts)
		}
	})
}

func TestCheck(t *testing.T) {
	a, bb, _ := syncPlans("192.0.2.2")
	b, _, _, _ := lockedBackend(t, true, nil)
	if err := b.Check(a); err != nil {
		t.Errorf("Check a: %v", err)
	}
	if err := b.Check(bb); err != nil {
		t.Errorf("Check b: %v", err)
	}
	moved, _, _ := syncPlans("192.0.2.9")
	if err := b.Check(moved); err == nil || !strings.Contains(err.Error(), "does not dnat to 192.0.2.9:80") {
		t.Errorf("Check of a moved attachment: %v", err)
	}
	c, _, _ := syncPlans("192.0.2.2")
	c.Owner.ContainerID = "c"
	if err := b.Check(c); err == nil || !strings.Contains(err.Error(), "missing chain") {
		t.Errorf("Check of an absent attachment: %v", err)
	}
}

func TestGCSelectsByNetworkAndValidity(t *testing.T) {
	a, bb, o := syncPlans("192.0.2.2")
	b, k, _, locks := lockedBackend(t, true, nil)
	if err := b.GC("net1", []plan.Owner{a.Owner}); err != nil {
		t.Fatal(err)
	}
	if *locks != 1 || len(k.scripts) != 1 {
		t.Fatalf("scripts %q", k.scripts)
	}
	tx := k.scripts[0]
	if !strings.Contains(tx, "delete chain ip cni_portmap "+ChainName(bb.Owner)) || !strings.Contains(tx, "hostports { tcp . 9090 }") ||
		strings.Contains(tx, ChainName(a.Owner)) || strings.Contains(tx, ChainName(o.Owner)) {
		t.Errorf("GC of net1 keeping a:\n%s", tx)
	}
	b, k, _, _ = lockedBackend(t, false, nil)
	if err := b.GC("net1", nil); err != nil || len(k.scripts) != 0 {
		t.Errorf("GC without a table: %v %q", err, k.scripts)
	}
}

// TestReady: beside the skeleton, its dispatch chain read is the answer;
// without it (a fresh node, after a flush) the write probe's, and only
// where the kernel cannot be probed (before Linux 6.3) a batch that adds
// the table, checked and aborted.
func TestReady(t *testing.T) {
	p := plan.Build(plan.Request{}, plan.IPv4, nil)
	refused := &nfnl.Error{Errno: unix.EPERM}
	for _, tt := range []struct {
		name        string
		skeleton    bool
		notWritable error
		want        error
		probes      int
		checks      int
	}{
		{"beside the skeleton", true, refused, nil, 0, 0},
		{"no table", false, nil, nil, 1, 0},
		{"no table, probe refused", false, refused, refused, 1, 0},
		{"no table, before Linux 6.3", false, nfnl.ErrNoProbe, nil, 1, 1},
	} {
		b, k, _, _ := lockedBackend(t, tt.skeleton, nil)
		k.notWritable = tt.notWritable
		err := b.Ready(p)
		if err != tt.want || k.probes != tt.probes || len(k.checks) != tt.checks || len(k.scripts) != 0 {
			t.Errorf("%s: Ready = %v, %d probes, checks %q, scripts %q; want %v, %d probes, %d checks, none committed",
				tt.name, err, k.probes, k.checks, k.scripts, tt.want, tt.probes, tt.checks)
		}
		if tt.checks == 1 && !strings.Contains(k.checks[0], "add table ip cni_portmap") {
			t.Errorf("%s: checked %q, want the table's add", tt.name, k.checks[0])
		}
	}
}

// TestReadyNeedsNftForConditions: conditions are nft syntax, so a config
// with them is not ready without nft; one without them needs no program.
func TestReadyNeedsNftForConditions(t *testing.T) {
	b, _, _, _ := lockedBackend(t, false, nil)
	t.Setenv("PATH", t.TempDir())
	if err := b.Ready(plan.Build(plan.Request{}, plan.IPv4, nil)); err != nil {
		t.Errorf("Ready without conditions and without nft: %v", err)
	}
	withConds := plan.Build(plan.Request{ConditionsV4: []string{"ip daddr != 10.0.0.0/8"}}, plan.IPv4, nil)
	if err := b.Ready(withConds); err == nil || !strings.Contains(err.Error(), "compiled by nft") {
		t.Errorf("Ready with conditions and without nft: %v", err)
	}
}

// A fast path falls back to the slow path only on the errnos of the states
// it expects (EEXIST, ENOENT, EBUSY); anything else goes back at once, in
// one transaction: ADD's without the host-wide lock, DEL's of single ports
// under it (its one path).
func TestFastPathsReturnUnexpectedErrors(t *testing.T) {
	a, _, _ := syncPlans("192.0.2.2")
	n, _, _ := syncPlans("192.0.2.9") // a new attachment, of ports no one holds
	n.Owner.ContainerID = "n"
	n.Mappings = plan.MappingsOf(plan.Mapping{HostPort: 8082, ContainerPort: 80, Protocol: plan.TCP})
	for _, tt := range []struct {
		name  string
		run   func(b *Backend) error
		locks int
	}{
		{"apply", func(b *Backend) error { return b.Apply(n) }, 0},
		{"remove", func(b *Backend) error { return b.Remove(a) }, 1},
	} {
		for _, errno := range []unix.Errno{unix.EPERM, unix.EMSGSIZE} {
			t.Run(tt.name+" "+errno.Error(), func(t *testing.T) {
				b, k, _, locks := lockedBackend(t, true, func(string) bool { return true })
				withFlatSkeleton(k, 24, 32)
				k.errno = errno
				err := tt.run(b)
				if !errors.Is(err, errno) || *locks != tt.locks || len(k.scripts) != 1 {
					t.Errorf("error %v, locks %d, transactions %d: want %v, %d locks, one transaction", err, *locks, len(k.scripts), errno, tt.locks)
				}
			})
		}
	}
}
