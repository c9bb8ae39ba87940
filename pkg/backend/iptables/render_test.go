package iptables

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

var (
	owner = fixture.Owner
	build = fixture.TestPlan
)

func manyPorts(r *plan.Request) {
	r.Mappings = plan.Mappings{}
	for p := 10001; p <= 10017; p++ {
		r.Mappings.Add(plan.Mapping{HostPort: p, ContainerPort: 80, Protocol: plan.TCP})
	}
}

func TestGoldenPayloads(t *testing.T) {
	ref := `-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net1\" id: \"c1\"" -m multiport --dports 7070 -j ` + ChainName(owner)
	tests := []struct {
		name string
		pl   *payload
	}{
		{"add-v4", addPayload(layoutOf(build(plan.IPv4, nil)))},
		{"add-v6", addPayload(layoutOf(build(plan.IPv6, nil)))},
		{"add-snat-off", addPayload(layoutOf(build(plan.IPv4, func(r *plan.Request) { r.Masquerade.Enabled = false })))},
		{"add-external-chain", addPayload(layoutOf(build(plan.IPv4, func(r *plan.Request) {
			r.Masquerade = plan.Masquerade{Enabled: true, ExternalSetMarkChain: "KUBE-MARK-MASQ"}
		})))},
		{"add-masqall-bit5", addPayload(layoutOf(build(plan.IPv4, func(r *plan.Request) { r.Masquerade.All, r.Masquerade.MarkBit = true, 5 })))},
		{"add-conditions", addPayload(layoutOf(build(plan.IPv4, func(r *plan.Request) {
			r.ConditionsV4 = []string{"!", "-s", "203.0.113.0/24", "-m", "comment", "--comment", "keep out"}
		})))},
		{"add-17-ports", addPayload(layoutOf(build(plan.IPv4, manyPorts)))},
		{"add-ranges-v4", addPayload(layoutOf(build(plan.IPv4, fixture.Ranges)))},
		{"add-ranges-v6", addPayload(layoutOf(build(plan.IPv6, fixture.Ranges)))},
		{"replace-v4", replaced(build(plan.IPv4, nil), ref)},
		{"del-fast-v4", delPayload(ChainName(build(plan.IPv4, nil).Owner), EntryRules(build(plan.IPv4, nil)), nil)},
		{"del-refs", delPayload(ChainName(build(plan.IPv4, func(r *plan.Request) { r.Mappings = plan.Mappings{} }).Owner), nil, []string{ref})},
		{"check-v4", checkPayload(layoutOf(build(plan.IPv4, nil)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fixture.Golden(t, filepath.Join("testdata", tt.name+".golden"), string(tt.pl.bytes()))
		})
	}
}

func TestChainNameIsUpstreams(t *testing.T) {
	// Computed by the upstream plugin's genDnatChain("net1", "c1"); a change
	// here strands every existing rule on upgrade.
	if got, want := ChainName(owner), "CNI-DN-c2d892b58e87e28a12fe6"; got != want {
		t.Errorf("ChainName = %q, want %q", got, want)
	}
	if got, want := entryComment(owner), `dnat name: "net1" id: "c1"`; got != want {
		t.Errorf("entryComment = %q, want %q", got, want)
	}
	long := entryComment(plan.Owner{Network: "n", ContainerID: strings.Repeat("a", 300)})
	if len(long) != maxComment || !strings.HasSuffix(long, "...") {
		t.Errorf("long comment has %d chars (%q...), want %d ending in ...", len(long), long[:20], maxComment)
	}
}

func TestExplain(t *testing.T) {
	pl := checkPayload(layoutOf(build(plan.IPv4, nil)))
	pl.bytes()
	tests := []struct{ out, want string }{
		{"iptables-restore: line 7 failed: Bad rule (does a matching rule exist in that chain?).", `rule "-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"`},
		{"iptables-restore: line 2 failed: Bad rule (does a matching rule exist in that chain?).", `rule "-A INPUT -j CNI-HOSTPORT-GUARD" (table filter)`},
		{"iptables-restore v1.8.9 (nf_tables): Chain 'X' does not exist\nError occurred at line: 9\n", "chain X"},
		{"Error occurred at line: 5\n", "table nat"},
		{"something else", ""},
		{"line 999 failed", ""},
	}
	for _, tt := range tests {
		if got := pl.explain(tt.out); got != tt.want {
			t.Errorf("explain(%q) = %q, want %q", tt.out, got, tt.want)
		}
	}
}

// masqAll's hairpin rule matches every source, "-s 0.0.0.0/0", which
// iptables takes and lists without: the chain as listed is the plan's.
func TestJudgeChainMasqAll(t *testing.T) {
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		p := fixture.TestPlan(f, func(r *plan.Request) { r.Masquerade.All = true })
		var lines []string
		for _, r := range ChainRules(p) {
			l := "-A " + ChainName(p.Owner) + " " + strings.Join(r.Args(), " ")
			l = strings.Replace(strings.Replace(l, "-s 0.0.0.0/0 ", "", 1), "-s ::/0 ", "", 1)
			lines = append(lines, l)
		}
		if !strings.Contains(strings.Join(ChainRules(p)[0].Args(), " "), "/0") {
			t.Fatalf("%s: the plan has no masqAll rule: %v", f, ChainRules(p))
		}
		l := layoutOf(p)
		if why := l.judge(f, chainRead{found: true, listed: true, lines: lines, refs: len(l.entries)}); why != "" {
			t.Errorf("%s: the chain as iptables lists it: %s", f, why)
		}
	}
}

// replaced is what ADD's slow path (a pass's repair of its one
// attachment) writes for p beside the skeleton, its chain there with the
// entry rule ref.
func replaced(p *plan.Plan, ref string) *payload {
	lines := []string{"-N " + TopLevelDNATChain, "-N " + SetMarkChain, "-N " + masqChain, "-N " + MarkerChain(13), "-N " + ChainName(p.Owner), ref}
	pl, _ := listed(p.Family, []*plan.Plan{p}, []*layout{layoutOf(p)}, lines).repair(converge.Repair[string]{Broken: map[int]bool{0: true}})
	return pl
}
