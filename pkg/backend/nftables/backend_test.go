package nftables

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

// The fake kernel (fake_test.go) holds, when listed, the node of
// syncPlans (net1/a, net1/b and old/o) and records the transactions,
// failing those the test says: the verbs' branches, without root.

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

// The first ADD of a node, of an attachment with conditions (which nft
// compiles), commits the skeleton on its own first, then the attachment:
// nft 0.9.8 refuses the skeleton's DNAT maps; one of a plain attachment
// is one transaction; a pass that writes the skeleton does the same.
func TestSkeletonApartFromConditions(t *testing.T) {
	_, cond, _ := syncPlans("192.0.2.2")
	plain, _, _ := syncPlans("192.0.2.2")
	for _, tt := range []struct {
		name string
		p    *plan.Plan
		want int
	}{{"with conditions", cond, 2}, {"without", plain, 1}} {
		for _, verb := range []string{"ADD", "sync"} {
			b, k, _, _ := lockedBackend(t, false, nil)
			var err error
			if verb == "ADD" {
				err = b.Apply(tt.p)
			} else {
				_, err = b.Sync([]*plan.Plan{tt.p}, converge.Options{})
			}
			if err != nil {
				t.Fatalf("%s %s: %v", verb, tt.name, err)
			}
			scripts := k.scripts
			if verb == "ADD" && len(scripts) > 0 && strings.HasPrefix(scripts[0], "create chain") {
				scripts = scripts[1:] // the fast path's, which the missing table fails
			}
			if len(scripts) != tt.want {
				t.Fatalf("%s %s: %d transactions, want %d: %q", verb, tt.name, len(scripts), tt.want, scripts)
			}
			if first := scripts[0]; !strings.Contains(first, "add chain ip cni_portmap dispatch") ||
				strings.Contains(first, "10.1.0.0/16") != (tt.want == 1 && len(tt.p.Conditions) > 0) {
				t.Errorf("%s %s: the first transaction %q", verb, tt.name, first)
			}
			if last := scripts[len(scripts)-1]; !strings.Contains(last, ChainName(tt.p.Owner)) ||
				(tt.want == 2 && strings.Contains(last, "add chain ip cni_portmap dispatch")) {
				t.Errorf("%s %s: the last transaction %q", verb, tt.name, last)
			}
			if err := b.Check(tt.p); err != nil {
				t.Errorf("%s %s: CHECK: %v", verb, tt.name, err)
			}
		}
	}
}

// A flat ADD's fast path reads the shared objects it needs first: with
// the hairpin sets of its prefix length missing (a /23 here), or a port
// held in a verdict map (b's chain, of conditions), it writes nothing but
// the slow path's one transaction, which makes the sets and takes the
// port. The slow path writes the skeleton only where it has a gap.
func TestApplyFlatReadsFirst(t *testing.T) {
	for _, tt := range []struct {
		name, cidr string
		port       int
		want       string
		skeleton   bool // the transaction writes the skeleton
	}{
		{"a hairpin set missing", "10.1.2.3/23", 8081, "add set ip cni_portmap hairpin_23", true},
		{"a port in a verdict map", "192.0.2.7/24", 9090, "delete element ip cni_portmap hostports { tcp . 9090 }", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := fixture.Attachment("new", tt.cidr, tt.port)
			b, k, _, locks := lockedBackend(t, true, nil)
			if err := b.Apply(c); err != nil {
				t.Fatal(err)
			}
			if len(k.scripts) != 1 || *locks != 1 || strings.Contains(k.scripts[0], "add table") != tt.skeleton ||
				!strings.Contains(k.scripts[0], tt.want) {
				t.Errorf("scripts %q, %d locks: want the slow path's one transaction, with %q, the skeleton written: %v", k.scripts, *locks, tt.want, tt.skeleton)
			}
			if err := b.Check(c); err != nil {
				t.Errorf("CHECK: %v", err)
			}
		})
	}
}

// A range's ADD is the slow path's, under the lock: beside a whole
// skeleton one transaction writes its chain and its interval and leaves
// the skeleton alone, and so does an ADD again; with a gap in the
// skeleton (the dispatch chain flushed), the ADD writes the skeleton too,
// and the dispatch finds the range again.
func TestApplyRange(t *testing.T) {
	r := rangePlan("new", "192.0.2.7/24", [2]int{20000, 20099})
	own := ChainName(r.Owner)
	b, k, _, locks := lockedBackend(t, true, nil)
	reaches := func(step string) {
		t.Helper()
		if got := trace(t, k.Memory, plan.TCP, fixture.Remote, fixture.HostIP, 20050, false).DNAT; got != "192.0.2.7:20050" {
			t.Errorf("%s: port 20050 goes to %q", step, got)
		}
		if err := b.Check(r); err != nil {
			t.Errorf("%s: CHECK: %v", step, err)
		}
	}
	for i, step := range []string{"ADD", "ADD again"} {
		if err := b.Apply(r); err != nil {
			t.Fatal(err)
		}
		if len(k.scripts) != i+1 || *locks != i+1 || strings.Contains(k.scripts[i], "add table") ||
			!strings.Contains(k.scripts[i], "add chain ip cni_portmap "+own) || !strings.Contains(k.scripts[i], "20000-20099") {
			t.Errorf("%s: scripts %q, %d locks: want one transaction under the lock, writing %s and its interval, not the skeleton", step, k.scripts, *locks, own)
		}
		reaches(step)
	}
	flush := newTx(plan.IPv4)
	flush.Flush(&nft.Chain{Name: DispatchChain})
	if err := k.Memory.Apply(flush); err != nil {
		t.Fatal(err)
	}
	if err := b.Apply(r); err != nil {
		t.Fatal(err)
	}
	if last := k.scripts[len(k.scripts)-1]; !strings.Contains(last, "add table ip cni_portmap") {
		t.Errorf("ADD beside a flushed dispatch chain wrote %q, not the skeleton", last)
	}
	reaches("ADD beside a flushed dispatch chain")
}

// c (flat) claims a's keys, held by a's flat elements, and b's port, held
// in the verdict map by b's chain: the fast path's read finds them, and
// the slow path moves them to c in one transaction, and logs it.
func TestApplyTakesOverNewestWins(t *testing.T) {
	c, _, _ := syncPlans("192.0.2.7")
	c.Owner.ContainerID = "c"
	c.Mappings.Add(plan.Mapping{HostPort: 9090, ContainerPort: 90, Protocol: plan.TCP})
	b, k, log, locks := lockedBackend(t, true, nil)
	if err := b.Apply(c); err != nil {
		t.Fatal(err)
	}
	if *locks != 1 || len(k.scripts) != 1 {
		t.Fatalf("scripts %q locks %d", k.scripts, *locks)
	}
	if !strings.Contains(k.scripts[0], "delete element ip cni_portmap hostports { tcp . 9090 }") {
		t.Errorf("slow path keeps b's verdict element:\n%s", k.scripts[0])
	}
	if err := b.Check(c); err != nil {
		t.Errorf("CHECK of c: %v", err)
	}
	for _, port := range []int{8080, 9090} {
		if got := trace(t, k.Memory, plan.TCP, fixture.Remote, fixture.HostIP, port, false).DNAT; !strings.HasPrefix(got, "192.0.2.7:") {
			t.Errorf("port %d goes to %q, want c's 192.0.2.7", port, got)
		}
	}
	for _, w := range []string{"tcp . 8080 was forwarded by chain " + ChainName(syncA().Owner), "tcp . 9090 was forwarded by chain " + ChainName(syncB().Owner)} {
		if !strings.Contains(log.String(), w) {
			t.Errorf("takeover not logged (%q): %q", w, log)
		}
	}
}

func syncA() *plan.Plan { a, _, _ := syncPlans("192.0.2.2"); return a }
func syncB() *plan.Plan { _, b, _ := syncPlans("192.0.2.2"); return b }

func TestReAddDropsStaleKeys(t *testing.T) {
	// a again, without its host-IP mapping, the slow way: its own stale
	// element goes.
	a := syncA()
	a.Mappings = plan.MappingsOf(a.Mappings.Slice()[:1]...)
	b, k, _, _ := lockedBackend(t, true, failing("create chain"))
	if err := b.Apply(a); err != nil {
		t.Fatal(err)
	}
	els, err := k.elements(Key{HostIP: netip.MustParseAddr("198.51.100.1"), Protocol: plan.UDP, Port: 8053, Flat: true})
	if err != nil || len(els) != 0 {
		t.Errorf("re-ADD keeps a stale key: %v %v", els, err)
	}
	if err := b.Check(a); err != nil {
		t.Errorf("CHECK: %v", err)
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
			!strings.Contains(k.scripts[0], "delete element ip cni_portmap hostport_dnat { tcp . 8080 }") {
			t.Errorf("scripts %q locks %d: want one transaction under the lock", k.scripts, *locks)
		}
		if strings.Contains(k.scripts[0], "add element") {
			t.Errorf("DEL adds an element:\n%s", k.scripts[0])
		}
	})
	t.Run("a key taken over stays with its new owner", func(t *testing.T) {
		// c took tcp . 8080 over: DEL reads the keys' elements and
		// releases only those still a's, then deletes the chain.
		b, k, _, locks := lockedBackend(t, true, nil)
		c := fixture.Attachment("c", "192.0.2.7/24", 8080)
		if err := b.Apply(c); err != nil {
			t.Fatal(err)
		}
		k.scripts, *locks = nil, 0
		if err := b.Remove(a); err != nil {
			t.Fatal(err)
		}
		last := k.scripts[len(k.scripts)-1]
		if *locks != 1 || len(k.scripts) != 1 || !strings.Contains(last, "delete chain ip cni_portmap "+ChainName(a.Owner)) ||
			strings.Contains(last, "tcp . 8080") || !strings.Contains(last, "198.51.100.1 . udp . 8053") {
			t.Errorf("scripts %q", k.scripts)
		}
		if err := b.Check(c); err != nil {
			t.Errorf("CHECK of c after a's DEL: %v", err)
		}
	})
	t.Run("without mappings: keys from the chain's claim rules", func(t *testing.T) {
		b, k, _, _ := lockedBackend(t, true, nil)
		bare := plan.Build(plan.Request{Owner: a.Owner}, plan.IPv4, nil)
		if err := b.Remove(bare); err != nil {
			t.Fatal(err)
		}
		all := strings.Join(k.scripts, "")
		if !strings.Contains(all, "hostport_dnat { tcp . 8080 }") || !strings.Contains(all, "hostip_hostport_dnat { 198.51.100.1 . udp . 8053 }") {
			t.Errorf("scripts %q: want both keys released", k.scripts)
		}
	})
	t.Run("upstream's rules of the container go too", func(t *testing.T) {
		b, k, _, _ := lockedBackend(t, false, nil)
		h := k.upstreamRule(t, plan.TCP, 6104, "192.0.2.66", 80, "a")
		bare := plan.Build(plan.Request{Owner: a.Owner}, plan.IPv4, nil)
		if err := b.Remove(bare); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("delete rule ip cni_hostport hostports handle %d\n", h); len(k.scripts) != 1 || k.scripts[0] != want {
			t.Errorf("scripts %q, want %q", k.scripts, want)
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
	if err := b.Check(moved); err == nil || !strings.Contains(err.Error(), ", not to 192.0.2.9:") {
		t.Errorf("Check of a moved attachment: %v", err)
	}
	c, _, _ := syncPlans("192.0.2.2")
	c.Owner.ContainerID = "c"
	if err := b.Check(c); err == nil || !strings.Contains(err.Error(), "chain "+ChainName(c.Owner)+" missing") {
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
				k.errno = errno
				err := tt.run(b)
				if !errors.Is(err, errno) || *locks != tt.locks || len(k.scripts) != 1 {
					t.Errorf("error %v, locks %d, transactions %d: want %v, %d locks, one transaction", err, *locks, len(k.scripts), errno, tt.locks)
				}
			})
		}
	}
}
