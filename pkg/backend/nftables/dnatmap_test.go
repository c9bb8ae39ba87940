package nftables

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

// singles is n single TCP mappings on the wildcard (20000, 20002, … to
// 80, 81, …) and, with addr, n more on the host's address.
func singles(n int, addr bool) func(*plan.Request) {
	return func(r *plan.Request) {
		r.Mappings = plan.Mappings{}
		for i := range n {
			r.Mappings.Add(plan.Mapping{HostPort: 20000 + 2*i, ContainerPort: 80 + i, Protocol: plan.TCP})
			if addr {
				r.Mappings.Add(plan.Mapping{HostIP: fixture.HostIP, HostPort: 21000 + 2*i, ContainerPort: 80, Protocol: plan.UDP})
			}
		}
	}
}

// dnatMaps are the DNAT map rules of rules.
func dnatMaps(rules []*nft.Rule) []dnatMap {
	var out []dnatMap
	for _, r := range rules {
		for _, s := range r.Stmts {
			if m, ok := s.(dnatMap); ok {
				out = append(out, m)
			}
		}
	}
	return out
}

// TestDNATMapFrom: from mapMin single mappings of a host IP kind, their
// DNAT is one map rule; below, a rule each; a range stays a rule.
func TestDNATMapFrom(t *testing.T) {
	for _, tt := range []struct {
		n     int
		addr  bool
		maps  int
		rules int // DNAT rules besides the maps
	}{
		{mapMin - 1, false, 0, mapMin - 1},
		{mapMin, false, 1, 0},
		{mapMin, true, 2, 0},
		{5000, false, 1, 0},
	} {
		p := build(plan.IPv4, inChain(singles(tt.n, tt.addr)))
		rules := layoutOf(p).rules
		maps := dnatMaps(rules)
		if len(maps) != tt.maps {
			t.Errorf("%d mappings (addr %v): %d maps, want %d", tt.n, tt.addr, len(maps), tt.maps)
		}
		keyed := 0
		for _, r := range rules {
			if strings.HasPrefix(r.Comment, keyComment) {
				keyed++
			}
		}
		if keyed != tt.rules {
			t.Errorf("%d mappings (addr %v): %d DNAT rules, want %d", tt.n, tt.addr, keyed, tt.rules)
		}
		entries := 0
		for _, m := range maps {
			entries += len(m.entries)
		}
		if want := p.Mappings.Len() - keyed; entries != want {
			t.Errorf("%d mappings (addr %v): %d map entries, want %d", tt.n, tt.addr, entries, want)
		}
	}
	p := build(plan.IPv4, func(r *plan.Request) {
		singles(mapMin, false)(r)
		for _, m := range fixture.Span(plan.TCP, 10000, 10000, 50) {
			r.Mappings.Add(m)
		}
	})
	rules := layoutOf(p).rules
	if last := rules[len(rules)-1]; last.Comment != keyComment+"tcp . 10000-10049" {
		t.Errorf("the range's rule is %q, want it after the map", last.Comment)
	}
	// with conditions (nft compiles the rules, and nft 0.9.8 parses no
	// DNAT by map of a concatenation), a rule each
	p = build(plan.IPv4, func(r *plan.Request) {
		singles(mapMin, false)(r)
		r.ConditionsV4 = []string{"ip daddr != 10.1.0.0/16"}
	})
	if rules := layoutOf(p).rules; len(dnatMaps(rules)) != 0 || len(rules) != 2+mapMin {
		t.Errorf("with conditions: %d rules, %d maps, want the 2 mark rules and %d DNAT rules", len(rules), len(dnatMaps(rules)), mapMin)
	}
}

// TestDNATMapInMemory: a chain with both maps forwards each port to its
// target, and no other port; CHECK passes; the keys and forwards read
// back; a flush is repaired to the same state; DEL leaves nothing of it.
func TestDNATMapInMemory(t *testing.T) {
	b, m := memBackend()
	p := build(plan.IPv4, singles(10, true))
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	for mp := range p.Mappings.All() {
		dst := fixture.HostIP
		got := trace(t, m, mp.Protocol, fixture.Remote, dst, mp.HostPort, false)
		if want := "192.0.2.2:" + strconv.Itoa(mp.ContainerPort); got.DNAT != want {
			t.Errorf("%s %d: %+v, want %s", mp.Protocol, mp.HostPort, got, want)
		}
	}
	for _, miss := range []struct {
		proto plan.Protocol
		port  int
	}{{plan.TCP, 20001}, {plan.UDP, 20000}, {plan.TCP, 21000}} {
		if got := trace(t, m, miss.proto, fixture.Remote, fixture.HostIP, miss.port, false); got.DNAT != "" {
			t.Errorf("%s %d: %+v, want nothing translated", miss.proto, miss.port, got)
		}
	}
	if err := b.Check(p); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	c := m.chain(ChainName(p.Owner))
	if got := ports(c.keys()); got != p.Mappings.Len() {
		t.Errorf("the chain names %d keys, want %d", got, p.Mappings.Len())
	}
	fs, err := b.Mappings()
	if err != nil || len(fs) != p.Mappings.Len() {
		t.Fatalf("Mappings: %d, %v; want %d", len(fs), err, p.Mappings.Len())
	}
	for _, f := range fs {
		if f.Owner.ContainerID != p.Owner.ContainerID || !f.ContainerIP.Equal(net.ParseIP("192.0.2.2")) || f.ContainerPort < 80 {
			t.Errorf("forward read back: %+v", f)
		}
	}

	afterAdd := m.Dump()
	m.FlushRuleset()
	if rep, err := b.Sync([]*plan.Plan{p}, converge.Options{}); err != nil || !rep.Wrote {
		t.Fatalf("sync after a flush: %+v, %v", rep, err)
	}
	if got := m.Dump(); got != afterAdd {
		t.Errorf("after sync:\n%s\nwant:\n%s", got, afterAdd)
	}

	if err := b.Remove(p); err != nil {
		t.Fatal(err)
	}
	if d := m.Dump(); strings.Contains(d, "dn-") {
		t.Errorf("left after DEL:\n%s", d)
	}
}

// inChain is mod, marking with bit 14: the attachment is not flat, its
// DNAT is in a chain of rules.
func inChain(mod func(*plan.Request)) func(*plan.Request) {
	return func(r *plan.Request) {
		mod(r)
		r.Masquerade.MarkBit = 14
	}
}

// TestJudgeDNATMap: CHECK names a map that lost a mapping, holds one
// more, or sends one elsewhere.
func TestJudgeDNATMap(t *testing.T) {
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		p := build(f, inChain(singles(12, true)))
		rules, _ := roundTrip(t, f, layoutOf(p).create())
		c := &ChainState{Rules: rules}
		if why := judgeChain(layoutOf(p), c); why != "" {
			t.Fatalf("%s: the chain as written: %s", f, why)
		}
		fewer := build(f, inChain(singles(12, true)))
		fewer.Mappings.Add(plan.Mapping{HostPort: 30000, ContainerPort: 80, Protocol: plan.TCP})
		if why := judgeChain(layoutOf(fewer), c); !strings.Contains(why, "tcp . 30000 does not dnat to") {
			t.Errorf("%s: a mapping missing from the map judged %q", f, why)
		}
		more := build(f, inChain(singles(12, true)))
		more.Mappings = plan.MappingsOf(more.Mappings.Slice()[1:]...)
		if why := judgeChain(layoutOf(more), c); !strings.Contains(why, "holds 12 mappings, want 11") {
			t.Errorf("%s: a mapping too many judged %q", f, why)
		}
		moved := build(f, inChain(singles(12, true)))
		ms := moved.Mappings.Slice()
		ms[2].ContainerPort = 99
		moved.Mappings = plan.MappingsOf(ms...)
		if why := judgeChain(layoutOf(moved), c); !strings.Contains(why, "does not dnat to") || !strings.Contains(why, ":99") {
			t.Errorf("%s: a moved mapping judged %q", f, why)
		}
	}
}
