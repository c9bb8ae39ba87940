package iptables

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/test/fixture"
)

// fakeKernel answers a canned listing and records what is written. A
// restore whose payload holds failOn fails naming that line, as
// iptables-restore does. Its tables are iptables-legacy's unless unlink
// is set: then Unlink answers with it and records the chain.
type fakeKernel struct {
	lines    []string
	restores []string
	ensures  []string
	failOn   string
	unlink   func(chain string) (bool, error)
	unlinked []string
	// err, when set, is what every restore fails with.
	err error
	// blameCommit names the COMMIT after the failing line, as
	// iptables-restore 1.8.7 does for a -C that fails.
	blameCommit bool
}

func (k *fakeKernel) Unlink(parent, chain string) (bool, error) {
	if k.unlink == nil {
		return false, xt.ErrLegacy
	}
	k.unlinked = append(k.unlinked, parent+" -> "+chain)
	return k.unlink(chain)
}

func (k *fakeKernel) Restore(p []byte) error {
	k.restores = append(k.restores, string(p))
	if k.err != nil {
		return k.err
	}
	if k.failOn == "" {
		return nil
	}
	lines := strings.Split(string(p), "\n")
	inTable := false
	for i, l := range lines {
		// as iptables-restore: a COMMIT outside a table fails
		switch {
		case strings.HasPrefix(l, "*"):
			inTable = true
		case l == "COMMIT" && !inTable:
			return &xt.RestoreError{Output: fmt.Sprintf("iptables-restore: line %d failed", i+1), Err: fmt.Errorf("exit status 1"), Refused: true}
		case l == "COMMIT":
			inTable = false
		}
	}
	for i, l := range lines {
		if !strings.Contains(l, k.failOn) {
			continue
		}
		n := i + 1
		for k.blameCommit && lines[n-1] != "COMMIT" {
			n++
		}
		return &xt.RestoreError{Output: fmt.Sprintf("iptables-restore: line %d failed", n), Err: fmt.Errorf("exit status 1"), Refused: true}
	}
	return nil
}
func (k *fakeKernel) Test([]byte) error { return nil }
func (k *fakeKernel) Writable() error   { return nfnl.ErrNoProbe }
func (k *fakeKernel) AddChain(string, string, []xt.Rule, []xt.Rule, ...string) error {
	return xt.ErrLegacy
}
func (k *fakeKernel) Chains(string, []string, bool) (map[string]xt.ChainSummary, error) {
	return nil, xt.ErrLegacy
}
func (k *fakeKernel) ListTable() ([]string, error) { return k.lines, nil }
func (k *fakeKernel) ListChain(chain string) ([]string, error) {
	var out []string
	for _, l := range k.lines {
		if l == "-N "+chain || strings.HasPrefix(l, "-A "+chain+" ") {
			out = append(out, l)
		}
	}
	return out, nil
}
func (k *fakeKernel) EnsureChain(c xt.Chain) error {
	k.ensures = append(k.ensures, "chain "+c.Name)
	return nil
}
func (k *fakeKernel) EnsureRule(r xt.Rule) error {
	k.ensures = append(k.ensures, describe(r))
	return nil
}

// The listing (testdata/sync-listing-v4.txt) is what iptables -t nat -S
// printed after this backend applied syncPlans(): a (8080/tcp and
// 198.51.100.1:8053/udp to 192.0.2.2), b (9090/tcp to 192.0.2.3, with the
// condition "! -d 10.1.0.0/16") on net1, and o (7070/tcp to 192.0.2.4) on
// network "old".
func syncPlans(aIP string) (a, b, o *plan.Plan) {
	return fixture.SyncPlans(aIP, []string{"!", "-d", "10.1.0.0/16"})
}

func syncBackend(t *testing.T, failOn string) (*Backend, *fakeKernel) {
	t.Helper()
	data, err := os.ReadFile("testdata/sync-listing-v4.txt")
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKernel{lines: strings.Split(strings.TrimSpace(string(data)), "\n"), failOn: failOn}
	return &Backend{Family: plan.IPv4, Kernel: k}, k
}

func TestSyncNothingToRepair(t *testing.T) {
	b, k := syncBackend(t, "")
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
	if rep.Wrote || len(k.restores) != 1 || !strings.Contains(k.restores[0], "-C CNI-HOSTPORT-DNAT") || len(k.ensures) != 0 {
		t.Errorf("nothing to repair wrote %v, restores %q, ensures %v; want one -C restore", rep.Wrote, k.restores, k.ensures)
	}
	if len(rep.Orphans) != 1 || rep.Orphans[0].Network != "old" || rep.Orphans[0].ContainerID != "o" ||
		rep.Orphans[0].Object != "chain CNI-DN-7d93c336ec738ae49049a" || rep.Orphans[0].Pruned {
		t.Errorf("orphans %+v, want old/o's chain, not pruned", rep.Orphans)
	}
}

func TestSyncPrune(t *testing.T) {
	b, k := syncBackend(t, "")
	a, bb, _ := syncPlans("192.0.2.2")
	rep, err := b.Sync([]*plan.Plan{a, bb}, converge.Options{Prune: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(k.restores) != 2 || !rep.Orphans[0].Pruned {
		t.Fatalf("restores %q, orphans %+v", k.restores, rep.Orphans)
	}
	want := []string{
		`-D CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"old\" id: \"o\"" -m multiport --dports 7070 -j CNI-DN-7d93c336ec738ae49049a`,
		":CNI-DN-7d93c336ec738ae49049a - [0:0]",
		"-X CNI-DN-7d93c336ec738ae49049a",
	}
	for _, w := range want {
		if !strings.Contains(k.restores[1], w+"\n") {
			t.Errorf("prune payload lacks %q:\n%s", w, k.restores[1])
		}
	}
	if strings.Contains(k.restores[1], "CNI-DN-08dd") {
		t.Errorf("prune payload touches a wanted chain:\n%s", k.restores[1])
	}

	// Out of scope, or cached meanwhile: not an orphan.
	for _, o := range []converge.Options{
		{Prune: true, InScope: func(n string) bool { return n == "net1" }},
		{Prune: true, Keep: func(n, id string) converge.Keep {
			if n == "old" && id == "o" {
				return converge.Keep{By: converge.ByCache, Why: "cached during the pass"}
			}
			return converge.Keep{}
		}},
	} {
		b, k := syncBackend(t, "")
		rep, _ := b.Sync([]*plan.Plan{a, bb}, o)
		if len(rep.Orphans) != 0 || len(k.restores) != 1 {
			t.Errorf("orphans %+v, restores %d; want none pruned", rep.Orphans, len(k.restores))
		}
	}
}

func TestSyncRepairsWrongTarget(t *testing.T) {
	for _, dry := range []bool{false, true} {
		b, k := syncBackend(t, "")
		a, bb, o := syncPlans("192.0.2.9") // a now at .9: its DNAT rules are wrong
		rep, err := b.Sync([]*plan.Plan{o, a, bb}, converge.Options{DryRun: dry})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Results[1].State != converge.Repaired || !strings.Contains(rep.Results[1].What, "rules missing or wrong") {
			t.Errorf("a: %+v, want repaired", rep.Results[1])
		}
		if rep.Results[0].State != converge.OK || rep.Results[2].State != converge.OK {
			t.Errorf("o, b: %+v, want ok", rep.Results)
		}
		if dry {
			if len(k.restores) != 1 || rep.Wrote {
				t.Errorf("dry run wrote: %q", k.restores)
			}
			continue
		}
		if len(k.restores) != 2 {
			t.Fatalf("restores %q, want check and repair", k.restores)
		}
		p := k.restores[1]
		for _, w := range []string{
			`-D CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net1\" id: \"a\"" -m multiport --dports 8080 -j CNI-DN-08ddbbf98c215b9f2bafc`,
			":CNI-DN-08ddbbf98c215b9f2bafc - [0:0]",
			"-A CNI-DN-08ddbbf98c215b9f2bafc -p tcp --dport 8080 -j DNAT --to-destination 192.0.2.9:80",
			"-I CNI-HOSTPORT-DNAT 1 -m comment",
		} {
			if !strings.Contains(p, w) {
				t.Errorf("repair payload lacks %q:\n%s", w, p)
			}
		}
		if strings.Contains(p, "CNI-DN-fbe3") || strings.Contains(p, "CNI-DN-7d93") {
			t.Errorf("repair touches attachments that are right:\n%s", p)
		}
	}
}

// restoreReleases are the two ways iptables-restore names a failed -C:
// its own line (1.8.9 and later), or the COMMIT after it (1.8.7).
var restoreReleases = []struct {
	name        string
	blameCommit bool
}{{"names the line", false}, {"blames COMMIT", true}}

func TestSyncConditionsCheckedExactly(t *testing.T) {
	for _, rel := range restoreReleases {
		t.Run(rel.name, func(t *testing.T) {
			// iptables prints b's condition in its own spelling; -C judges
			// it. Here the kernel refuses b's -C line: b's entry rule differs.
			b, k := syncBackend(t, `-C CNI-HOSTPORT-DNAT -m comment --comment "dnat name: \"net1\" id: \"b\""`)
			k.blameCommit = rel.blameCommit
			a, bb, _ := syncPlans("192.0.2.2")
			rep, err := b.Sync([]*plan.Plan{a, bb}, converge.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Results[0].State != converge.OK || rep.Results[1].State != converge.Repaired {
				t.Errorf("results %+v, want a ok, b repaired", rep.Results)
			}
			if len(k.restores) < 3 {
				t.Errorf("restores %q, want the failed check, the check without b, and b's repair", k.restores)
			}
		})
	}
}

func TestSyncSharedMissing(t *testing.T) {
	for _, rel := range restoreReleases {
		t.Run(rel.name, func(t *testing.T) {
			b, k := syncBackend(t, "-C PREROUTING -m addrtype")
			k.blameCommit = rel.blameCommit
			a, bb, _ := syncPlans("192.0.2.2")
			rep, err := b.Sync([]*plan.Plan{a, bb}, converge.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Shared) != 1 || !strings.Contains(rep.Shared[0], "PREROUTING") {
				t.Errorf("shared %q, want the PREROUTING jump", rep.Shared)
			}
			if len(k.ensures) == 0 || !rep.Wrote {
				t.Errorf("shared objects not ensured: %v", k.ensures)
			}
			for _, r := range rep.Results {
				if r.State != converge.OK {
					t.Errorf("attachment %+v, want ok (only the shared jump was missing)", r)
				}
			}
		})
	}
}

func TestSyncChainMissing(t *testing.T) {
	// A flushed and deleted nat table: only policies, and the shared
	// rules' -C fails. The shared chains, and the rules that cannot exist
	// without them, go into the one restore with the attachments; only the
	// filter table's guard is checked and inserted rule by rule.
	b, k := syncBackend(t, "-C PREROUTING")
	k.lines = k.lines[:4]
	a, bb, _ := syncPlans("192.0.2.2")
	rep, err := b.Sync([]*plan.Plan{a, bb}, converge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.State != converge.Repaired || !strings.HasPrefix(r.What, "missing chain CNI-DN-") {
			t.Errorf("%+v, want repaired: chain missing", r)
		}
	}
	if len(rep.Shared) != 2 || rep.Shared[0] != "chain CNI-HOSTPORT-BIT13 missing" {
		t.Errorf("shared %q, want the marker and the rules", rep.Shared)
	}
	for _, e := range k.ensures {
		if !strings.Contains(e, "GUARD") {
			t.Errorf("ensured one by one: %q; want only the filter table's guard", e)
		}
	}
	last := k.restores[len(k.restores)-1]
	for _, w := range []string{
		"-N CNI-HOSTPORT-DNAT\n", "-N CNI-HOSTPORT-SETMARK\n", "-N CNI-HOSTPORT-MASQ\n",
		"-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n",
		"-I POSTROUTING 1 -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ\n",
	} {
		if !strings.Contains(last, w) {
			t.Errorf("repair payload lacks %q:\n%s", w, last)
		}
	}
	if strings.Count(last, ":CNI-DN-") != 2 || strings.Index(last, "-N CNI-HOSTPORT-SETMARK") > strings.Index(last, ":CNI-DN-") ||
		!strings.HasSuffix(last, "-N CNI-HOSTPORT-BIT13\nCOMMIT\n") {
		t.Errorf("repair payload (shared chains first, then both attachments, the marker last):\n%s", last)
	}
}

func TestCascadeKeepsNewestOnTop(t *testing.T) {
	a, _, _ := syncPlans("192.0.2.2")
	newer, _, _ := syncPlans("192.0.2.7")
	newer.Owner.ContainerID = "newer"
	other, _, _ := syncPlans("192.0.2.8")
	other.Owner.ContainerID = "other"
	other.Mappings = plan.MappingsOf(plan.Mapping{HostPort: 1, ContainerPort: 1, Protocol: plan.TCP})
	whys := []string{"chain missing", "", ""}
	cascade([]*plan.Plan{a, newer, other}, whys)
	if whys[1] == "" || whys[2] != "" {
		t.Errorf("whys %q: want the newer plan of the same port re-applied, the other left alone", whys)
	}
}

func TestSplitRule(t *testing.T) {
	got := xt.SplitRule(`-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net1\" id: \"a\"" -m multiport --dports 8080 -j X`)
	want := []string{"-A", "CNI-HOSTPORT-DNAT", "-p", "tcp", "-m", "comment", "--comment", `dnat name: "net1" id: "a"`,
		"-m", "multiport", "--dports", "8080", "-j", "X"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("splitRule:\n got %q\nwant %q", got, want)
	}
}
