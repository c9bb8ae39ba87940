package nftables

import (
	"fmt"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/test/fixture"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// syncPlans are the attachments a node of the tests holds: a (8080/tcp
// and 198.51.100.1:8053/udp to 192.0.2.2; flat), b (9090/tcp to
// 192.0.2.3, condition "ip daddr != 10.1.0.0/16"; a chain) on net1, and o
// (7070/tcp to 192.0.2.4; flat) on network "old".
func syncPlans(aIP string) (a, b, o *plan.Plan) {
	return fixture.SyncPlans(aIP, []string{"ip daddr != 10.1.0.0/16"})
}

func syncBackend(t *testing.T, listed bool) (*Backend, *fakeKernel) {
	t.Helper()
	k := &fakeKernel{Memory: NewMemory()}
	if listed {
		a, b, o := syncPlans("192.0.2.2")
		k.seed(t, a, b, o)
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
	upc := k.upstreamRule(t, plan.TCP, 6104, "192.0.2.66", 80, "upc")
	upa := k.upstreamRule(t, plan.TCP, 6105, "192.0.2.67", 80, "a")
	k.scripts = nil
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
		"delete element ip cni_portmap hostport_dnat { tcp . 7070 }",
		"delete chain ip cni_portmap dn-cba06b5736faf67e-8dad2c8e4ab28af5",
		fmt.Sprintf("delete rule ip cni_hostport hostports handle %d\n", upc),
	} {
		if !strings.Contains(s, w) {
			t.Errorf("prune script lacks %q:\n%s", w, s)
		}
	}
	if strings.Contains(s, fmt.Sprintf("handle %d\n", upa)) || strings.Contains(s, "8080") {
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
	if rep.Results[1].State != converge.Repaired || !strings.Contains(rep.Results[1].What, "not to 192.0.2.9:80") {
		t.Errorf("a: %+v, want repaired naming the target", rep.Results[1])
	}
	if rep.Results[0].State != converge.OK || rep.Results[2].State != converge.OK {
		t.Errorf("o, b: %+v, want ok", rep.Results)
	}
	if len(k.scripts) != 1 {
		t.Fatalf("scripts %q", k.scripts)
	}
	s := k.scripts[0]
	own := ChainName(a.Owner)
	for _, w := range []string{
		"add element ip cni_portmap hostport_dnat { tcp . 8080 comment \"" + own + " 192.0.2.0/24 127.0.0.1/32\" : 192.0.2.9 . 80 }",
		"add element ip cni_portmap hostip_hostport_dnat { 198.51.100.1 . udp . 8053 comment \"" + own + " 192.0.2.0/24 127.0.0.1/32\" : 192.0.2.9 . 53 }",
	} {
		if !strings.Contains(s, w) {
			t.Errorf("repair script lacks %q:\n%s", w, s)
		}
	}
	if strings.Contains(s, ChainName(bb.Owner)) || strings.Contains(s, "7070") {
		t.Errorf("repair rewrites what is right (b, o):\n%s", s)
	}
	for _, p := range []*plan.Plan{o, a, bb} {
		if err := b.Check(p); err != nil {
			t.Errorf("CHECK %s after the repair: %v", p.Owner.ContainerID, err)
		}
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
