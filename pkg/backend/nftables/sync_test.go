package nftables

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/test/fixture"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// The listing (testdata/sync-listing-v4.txt) is what nft -a printed after
// this backend applied syncPlans(): a (8080/tcp and 198.51.100.1:8053/udp
// to 192.0.2.2), b (9090/tcp to 192.0.2.3, condition "ip daddr !=
// 10.1.0.0/16") on net1, and o (7070/tcp to 192.0.2.4) on network "old".
func syncPlans(aIP string) (a, b, o *plan.Plan) {
	return fixture.SyncPlans(aIP, []string{"ip daddr != 10.1.0.0/16"})
}

func syncBackend(t *testing.T, listed bool) (*Backend, *fakeKernel) {
	t.Helper()
	k := &fakeKernel{tables: map[string]string{}}
	if listed {
		data, err := os.ReadFile("testdata/sync-listing-v4.txt")
		if err != nil {
			t.Fatal(err)
		}
		k.tables["ip "+Table] = string(data)
	}
	return &Backend{Family: plan.IPv4, Kernel: k}, k
}

func TestSyncNothingToRepair(t *testing.T) {
	b, k := syncBackend(t, true)
	a, bb, _ := syncPlans("192.0.2.2")
	rep, err := b.Sync([]*plan.Plan{a, bb}, converge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rep.Results {
		if r.State != converge.OK {
			t.Errorf("plan %d: %+v, want ok", i, r)
		}
	}
	if len(rep.Shared) != 0 || len(k.scripts) != 0 || rep.Wrote {
		t.Errorf("shared %q, scripts %q: want nothing written", rep.Shared, k.scripts)
	}
	if len(rep.Orphans) != 1 || rep.Orphans[0].Network != "old" || rep.Orphans[0].ContainerID != "o" || rep.Orphans[0].Pruned {
		t.Errorf("orphans %+v, want old/o, not pruned", rep.Orphans)
	}
}

func TestSyncPrune(t *testing.T) {
	b, k := syncBackend(t, true)
	k.tables["ip "+UpstreamTable] = "table ip cni_hostport { # handle 9\n\tchain hostports { # handle 1\n" +
		"\t\ttcp dport 6104 dnat to 192.0.2.66:80 comment \"upc\" # handle 4\n" +
		"\t\ttcp dport 6105 dnat to 192.0.2.67:80 comment \"a\" # handle 5\n\t}\n}\n"
	a, bb, _ := syncPlans("192.0.2.2")
	rep, err := b.Sync([]*plan.Plan{a, bb}, converge.Options{Prune: true})
	if err != nil {
		t.Fatal(err)
	}
	// Ours and upstream's table: one transaction each.
	if len(k.scripts) != 2 || len(rep.Orphans) != 2 {
		t.Fatalf("scripts %q, orphans %+v", k.scripts, rep.Orphans)
	}
	s := strings.Join(k.scripts, "")
	for _, w := range []string{
		"delete element ip cni_portmap hostports { tcp . 7070 }",
		"delete chain ip cni_portmap dn-cba06b5736faf67e-8dad2c8e4ab28af5",
		"delete rule ip cni_hostport hostports handle 4",
	} {
		if !strings.Contains(s, w) {
			t.Errorf("prune script lacks %q:\n%s", w, s)
		}
	}
	if strings.Contains(s, "handle 5") || strings.Contains(s, "8080") {
		t.Errorf("prune script touches what is wanted (a's ID, a's port):\n%s", s)
	}
	for _, o := range rep.Orphans {
		if !o.Pruned {
			t.Errorf("orphan %+v not pruned", o)
		}
	}
}

func TestSyncRepairsWrongTarget(t *testing.T) {
	b, k := syncBackend(t, true)
	a, bb, o := syncPlans("192.0.2.9")
	rep, err := b.Sync([]*plan.Plan{o, a, bb}, converge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[1].State != converge.Repaired || !strings.Contains(rep.Results[1].What, "dnat to 192.0.2.9:80") {
		t.Errorf("a: %+v, want repaired naming the target", rep.Results[1])
	}
	if rep.Results[0].State != converge.OK || rep.Results[2].State != converge.OK {
		t.Errorf("o, b: %+v, want ok", rep.Results)
	}
	if len(k.scripts) != 1 {
		t.Fatalf("scripts %q", k.scripts)
	}
	// a, a chain of an older layout, is rewritten flat: its chain emptied,
	// its record and DNAT elements written, its verdict elements gone
	// (and the skeleton's flat parts, which the node lacked, written)
	s := k.scripts[0]
	own := "dn-6c270ef2f251d571-a23508c67eab7c80"
	for _, w := range []string{
		"flush chain ip cni_portmap " + own,
		"add rule ip cni_portmap " + own + " meta l4proto tcp th dport 8080 comment \"record tcp . 8080\"",
		"add element ip cni_portmap owners { " + net.IP(ownerKey(own)).String() + " : goto " + own + " }",
		"add map ip cni_portmap owners",
		"delete element ip cni_portmap hostports { tcp . 8080 }",
		"add element ip cni_portmap hostport_dnat { tcp . 8080 comment \"" + own + " 192.0.2.0/24 127.0.0.1/32\" : 192.0.2.9 . 80 }",
		"add map ip cni_portmap hostport_dnat",
	} {
		if !strings.Contains(s, w) {
			t.Errorf("repair script lacks %q:\n%s", w, s)
		}
	}
	if strings.Contains(s, "c5446b7f5df41560") || strings.Contains(s, "7070") {
		t.Errorf("repair rewrites what is right (b, o):\n%s", s)
	}
}

func TestSyncNewestWins(t *testing.T) {
	b, k := syncBackend(t, true)
	a, _, _ := syncPlans("192.0.2.2")
	c, _, _ := syncPlans("192.0.2.5") // newer, same keys, not applied yet
	c.Owner.ContainerID = "c"
	rep, err := b.Sync([]*plan.Plan{a, c}, converge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[0].State != converge.OK || rep.Results[1].State != converge.Repaired {
		t.Fatalf("results %+v: want a ok (its keys are c's now), c repaired", rep.Results)
	}
	s := k.scripts[0]
	own := ChainName(c.Owner)
	for _, w := range []string{
		"delete element ip cni_portmap hostports { tcp . 8080 }",
		"add element ip cni_portmap hostport_dnat { tcp . 8080 comment \"" + own + " 192.0.2.0/24 127.0.0.1/32\" : 192.0.2.5 . 80 }",
		"add element ip cni_portmap hostip_hostport_dnat { 198.51.100.1 . udp . 8053 comment \"" + own + " 192.0.2.0/24 127.0.0.1/32\" : 192.0.2.5 . 53 }",
		"add element ip cni_portmap hairpin_24 { 192.0.2.0 . tcp . 8080 comment \"" + own + "\" }",
	} {
		if !strings.Contains(s, w) {
			t.Errorf("script lacks %q:\n%s", w, s)
		}
	}
}

func TestSyncEmptyTable(t *testing.T) {
	b, k := syncBackend(t, false)
	a, _, _ := syncPlans("192.0.2.2")
	rep, err := b.Sync([]*plan.Plan{a}, converge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Shared) == 0 || rep.Results[0].State != converge.Repaired {
		t.Fatalf("shared %q, results %+v", rep.Shared, rep.Results)
	}
	s := k.scripts[0]
	if !strings.Contains(s, "add table ip cni_portmap") || !strings.Contains(s, "add rule ip cni_portmap dispatch") ||
		strings.Contains(s, "delete element") || !strings.Contains(s, "add element ip cni_portmap hostport_dnat { tcp . 8080") {
		t.Errorf("script:\n%s", s)
	}
}

func TestSyncDryRunWritesNothing(t *testing.T) {
	b, k := syncBackend(t, false)
	a, _, _ := syncPlans("192.0.2.2")
	rep, err := b.Sync([]*plan.Plan{a}, converge.Options{DryRun: true, Prune: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(k.scripts) != 0 || rep.Wrote || rep.Results[0].State != converge.Repaired {
		t.Errorf("dry run: scripts %q, results %+v", k.scripts, rep.Results)
	}
}
