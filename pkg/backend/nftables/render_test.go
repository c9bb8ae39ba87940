package nftables

import (
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

var (
	owner = fixture.Owner
	build = fixture.TestPlan
)

// skeletonTx is what the slow path writes before an attachment.
func skeletonTx(p *plan.Plan) string {
	tx := newTx(p.Family)
	addSkeletonOf(tx, p)
	return tx.Text()
}

// addSkeletonOf writes the skeleton p's attachment needs, as the slow
// path does on an empty node.
func addSkeletonOf(tx *nft.Tx, p *plan.Plan) {
	l := layoutOf(p)
	addSkeleton(tx, l.needs, l.lengths)
}

// addTx is the ADD transaction Apply sends on a node with the skeleton
// and no other attachment: the fast path's, or for a plan with intervals
// the one written under the lock after reading what shares its ports.
func addTx(p *plan.Plan) string {
	if !layoutOf(p).hasRanges() {
		return layoutOf(p).create().Text()
	}
	tx := newTx(p.Family)
	l := layoutOf(p)
	l.rewriteChain(tx, nil)
	place(tx, l, nil, nil, io.Discard)
	return tx.Text()
}

// delTx is a range's DEL fast path (single ports read their elements
// under the lock instead), with p's keys as a chain holds them.
func delTx(p *plan.Plan) string {
	keys := layoutOf(p).keys
	for i := range keys {
		keys[i] = keys[i].port()
	}
	return fastDelTx(p.Family, ChainName(p.Owner), keys).Text()
}

func TestGoldenTransactions(t *testing.T) {
	tests := []struct{ name, got string }{
		{"skeleton-v4", skeletonTx(build(plan.IPv4, nil))},
		{"skeleton-v6-snat-off", skeletonTx(build(plan.IPv6, func(r *plan.Request) { r.Masquerade.Enabled = false }))},
		{"add-v4", addTx(build(plan.IPv4, nil))},
		{"add-v6", addTx(build(plan.IPv6, nil))},
		{"add-snat-off", addTx(build(plan.IPv4, func(r *plan.Request) { r.Masquerade.Enabled = false }))},
		{"add-masqall-bit5-conditions", addTx(build(plan.IPv4, func(r *plan.Request) {
			r.Masquerade.All, r.Masquerade.MarkBit = true, 5
			r.ConditionsV4 = []string{"ip saddr != 203.0.113.0/24"}
		}))},
		{"del-v4", delTx(build(plan.IPv4, nil))},
		{"add-ranges-v4", addTx(build(plan.IPv4, smallRanges))},
		{"add-ranges-v6", addTx(build(plan.IPv6, smallRanges))},
		{"del-ranges-v4", delTx(build(plan.IPv4, smallRanges))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fixture.Golden(t, filepath.Join("testdata", tt.name+".golden"), tt.got)
		})
	}
}

// smallRanges has the shapes of fixture.Ranges with a range of 5 ports
// in place of 1000 (an offset range holds a rule and an element per
// port): an identity range, a single mapping, an offset range, a UDP
// range on one host IP.
func smallRanges(r *plan.Request) {
	fixture.Ranges(r)
	r.Mappings = plan.MappingsOf(append(fixture.Span(plan.TCP, 10000, 10000, 5), r.Mappings.Slice()[1000:]...)...)
}

func TestNames(t *testing.T) {
	// Kernel-kept names: a change strands existing state on upgrade.
	if got, want := ChainName(owner), "dn-6c270ef2f251d571-15e80ba988d4bd27"; got != want {
		t.Errorf("ChainName = %q, want %q", got, want)
	}
	other := plan.Owner{Network: "net1", ContainerID: "c1", IfName: "eth1"}
	if ChainName(other) == ChainName(owner) {
		t.Error("two interfaces of one container share a chain")
	}
	if got := networkPrefix("net1"); got != ChainName(owner)[:len(got)] {
		t.Errorf("NetworkPrefix %q does not start the chain name", got)
	}
}

func TestKeysRoundTrip(t *testing.T) {
	for _, k := range layoutOf(build(plan.IPv4, nil)).keys {
		back, ok := parseKey(k.String())
		if !ok || back.String() != k.String() || back.Map() != k.port().Map() {
			t.Errorf("parseKey(%q) = %v, %v", k, back, ok)
		}
	}
	for _, bad := range []string{"", "tcp", "icmp . 80", "tcp . x", "nope . tcp . 80"} {
		if k, ok := parseKey(bad); ok {
			t.Errorf("parseKey(%q) accepted: %v", bad, k)
		}
	}
}

// TestNetlinkRoundTrip decodes what the writer encodes: each rule of an
// ADD reads back with its comment, DNAT target, hairpin source and jump,
// each element with its key and verdict — the reader and writer agree
// without a kernel (the kernel test holds both to nft).
func TestNetlinkRoundTrip(t *testing.T) {
	chained := func(r *plan.Request) { r.Masquerade.MarkBit = 14 } // not flat: DNAT rules
	for _, p := range []*plan.Plan{build(plan.IPv4, chained), build(plan.IPv6, chained),
		build(plan.IPv4, func(r *plan.Request) { r.Masquerade.All, r.Masquerade.MarkBit = true, 5 }),
		build(plan.IPv4, smallRanges), build(plan.IPv6, smallRanges)} {
		rules, elems := roundTrip(t, p.Family, layoutOf(p).create())
		want := layoutOf(p).rules
		if len(rules) != len(want) {
			t.Fatalf("%s: %d rules decoded, want %d", p.Family, len(rules), len(want))
		}
		c := &ChainState{Rules: rules}
		if why := judgeChain(layoutOf(p), c); why != "" {
			t.Errorf("%s: the decoded chain does not pass: %s", p.Family, why)
		}
		for i, r := range rules {
			if r.Comment != want[i].Comment {
				t.Errorf("%s rule %d: comment %q, want %q", p.Family, i, r.Comment, want[i].Comment)
			}
		}
		if len(elems) != len(layoutOf(p).keys) {
			t.Fatalf("%s: %d elements decoded, want %d", p.Family, len(elems), len(layoutOf(p).keys))
		}
		for i, k := range layoutOf(p).keys {
			if k = k.port(); elems[i].Key != k || elems[i].Chain != ChainName(p.Owner) {
				t.Errorf("%s element %d: %v -> %s, want %v -> %s", p.Family, i, elems[i].Key, elems[i].Chain, k, ChainName(p.Owner))
			}
		}
		// A wrong target is what CHECK must see.
		moved := *p
		moved.ContainerNet = &net.IPNet{IP: net.ParseIP("192.0.2.99").To4(), Mask: p.ContainerNet.Mask}
		if p.Family == plan.IPv6 {
			moved.ContainerNet.IP = net.ParseIP("2001:db8::99")
		}
		if why := judgeChain(layoutOf(&moved), c); !strings.Contains(why, "does not dnat to") {
			t.Errorf("%s: a moved container judged %q", p.Family, why)
		}
		// So is a rule under its comment that matches another protocol,
		// port or host address, marks for another bit, or jumps elsewhere.
		for i, r := range rules {
			for _, tamper := range []struct {
				name string
				set  func(*RuleState) bool
				want string
			}{
				{"protocol", func(r *RuleState) bool {
					return tamperStmt(r, func(s nft.L4Proto) nft.L4Proto {
						return nft.L4Proto{Name: map[string]string{"tcp": "udp", "udp": "sctp", "sctp": "tcp"}[s.Name]}
					})
				}, "does not meta l4proto"},
				{"port", func(r *RuleState) bool {
					return tamperStmt(r, func(s nft.DPort) nft.DPort { s.Port++; return s })
				}, "does not th dport"},
				{"host address", func(r *RuleState) bool {
					return tamperStmt(r, func(s nft.Addr) nft.Addr {
						if !s.Dst {
							return s
						}
						return nft.Addr{Dst: true, Spec: "203.0.113.9"}
					})
				}, "daddr"},
				{"source", func(r *RuleState) bool {
					return tamperStmt(r, func(s nft.Addr) nft.Addr {
						if s.Dst {
							return s
						}
						return nft.Addr{Spec: "203.0.113.0/24"}
					})
				}, "saddr"},
				{"jump", func(r *RuleState) bool {
					return tamperStmt(r, func(nft.Jump) nft.Jump { return nft.Jump{To: "mark-bit1"} })
				}, "does not jump"},
			} {
				bad := slices.Clone(rules)
				if !tamper.set(&bad[i]) {
					continue
				}
				if why := judgeChain(layoutOf(p), &ChainState{Rules: bad}); !strings.Contains(why, tamper.want) {
					t.Errorf("%s rule %d (%q) with another %s judged %q, want %q", p.Family, i, r.Comment, tamper.name, why, tamper.want)
				}
			}
		}
	}
}

// tamperStmt changes, in a copy of r's rule, each statement of type T
// by change, and says whether it changed one.
func tamperStmt[T nft.Stmt](r *RuleState, change func(T) T) bool {
	c := *r.Rule
	c.Stmts = slices.Clone(c.Stmts)
	changed := false
	for i, s := range c.Stmts {
		if t, ok := s.(T); ok {
			c.Stmts[i] = change(t)
			changed = changed || c.Stmts[i] != s
		}
	}
	r.Rule = &c
	return changed
}

// roundTrip encodes tx and decodes its rules and elements.
func roundTrip(t *testing.T, f plan.Family, tx *nft.Tx) (rules []RuleState, elems []Element) {
	t.Helper()
	msgs, err := tx.Messages()
	if err != nil {
		t.Fatal(err)
	}
	var dnats []MapDNAT // of the anonymous map the next rule looks up
	for _, m := range msgs {
		switch m.Type {
		case nfnl.NftType(unix.NFT_MSG_NEWRULE):
			r := decodeRule(f, nfnl.Parse(m.Attrs))
			if slices.ContainsFunc(r.Lookups(), func(l nft.Lookup) bool { return l.Data }) {
				r.DNATs, dnats = dnats, nil
			}
			rules = append(rules, r)
		case nfnl.NftType(unix.NFT_MSG_NEWSETELEM):
			if set, _ := nfnl.Find(m.Attrs, unix.NFTA_SET_ELEM_LIST_SET); strings.HasPrefix(string(set), "__map") {
				dnats = append(dnats, decodeDNATs(f, m.Attrs)...)
				continue
			}
			elems = append(elems, decodeElements(f, m.Attrs)...)
		}
	}
	return rules, elems
}

func TestConditionsNeedNft(t *testing.T) {
	p := build(plan.IPv4, func(r *plan.Request) { r.ConditionsV4 = []string{"ip saddr != 203.0.113.0/24"} })
	tx := layoutOf(p).create()
	if !tx.NeedsNft() {
		t.Error("a transaction with conditions does not ask for nft")
	}
	if _, err := tx.Messages(); err == nil {
		t.Error("conditions were encoded without nft")
	}
	if layoutOf(build(plan.IPv4, nil)).create().NeedsNft() {
		t.Error("a transaction without conditions asks for nft")
	}
}

// ports counts the ports of keys.
func ports(keys []Key) int {
	n := 0
	for _, k := range keys {
		n += k.last() - k.Port + 1
	}
	return n
}
