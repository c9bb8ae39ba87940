package nftables

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// TestLayoutShapes: the shape each kind of plan takes, and what its
// attachment owns in that shape (fixture.TestPlan: three single
// mappings on the wildcard, one on a host IP, masquerading from its /24
// and localhost).
func TestLayoutShapes(t *testing.T) {
	for _, tt := range []struct {
		name      string
		mod       func(*plan.Request)
		flat      bool
		rules     int // in its chain: claim rules, or hairpin/localhost marks and DNAT rules
		hairpins  int
		lengths   []int
		intervals int
	}{
		{"flat", nil, true, 4, 8, []int{32, 24}, 0},
		{"flat, no masquerade", func(r *plan.Request) { r.Masquerade.Enabled = false }, true, 4, 0, nil, 0},
		{"another mark bit", func(r *plan.Request) { r.Masquerade.MarkBit = 14 }, false, 6, 0, nil, 0},
		{"conditions", func(r *plan.Request) { r.ConditionsV4 = []string{`iifname != "lo"`} }, false, 6, 0, nil, 0},
		{"ranges", smallRanges, false, -1, 0, nil, 2}, // tcp 10000-10004, 198.51.100.1 udp 5000-5002
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := build(plan.IPv4, tt.mod)
			l := layoutOf(p)
			if l.flat != tt.flat {
				t.Fatalf("flat = %v, want %v", l.flat, tt.flat)
			}
			if tt.rules >= 0 && len(l.rules) != tt.rules {
				t.Errorf("%d rules, want %d: %v", len(l.rules), tt.rules, l.rules)
			}
			if len(l.hairpins) != tt.hairpins || !slices.Equal(l.lengths, tt.lengths) {
				t.Errorf("%d hairpin elements of lengths %v, want %d of %v", len(l.hairpins), l.lengths, tt.hairpins, tt.lengths)
			}
			intervals := 0
			for i, e := range l.elements {
				if e.Key != l.keys[i] || e.Chain != l.chain.Name {
					t.Errorf("element %d is %v, want key %v in %s", i, e, l.keys[i], l.chain.Name)
				}
				if e.Key.Flat != l.flat {
					t.Errorf("element %v: flat %v in a layout of flat %v", e, e.Key.Flat, l.flat)
				}
				if e.Key.IsRange() {
					intervals++
				}
				// a flat element holds its target; a verdict's the chain
				if want := l.flat; e.To.IsValid() != want {
					t.Errorf("element %v: target %v", e, e.To)
				}
			}
			if intervals != tt.intervals {
				t.Errorf("%d interval keys, want %d", intervals, tt.intervals)
			}
		})
	}
}

// TestLayoutTargets: a flat element's target is where its mapping goes,
// as the plan says, by host IP and protocol.
func TestLayoutTargets(t *testing.T) {
	p := build(plan.IPv4, nil)
	l := layoutOf(p)
	got := map[Key]netip.AddrPort{}
	for _, e := range l.elements {
		got[e.Key] = e.To
	}
	for m := range p.Mappings.All() {
		k := Key{HostIP: addrOf(m.HostIP), Protocol: m.Protocol, Port: m.HostPort, Flat: true}
		if want := netip.MustParseAddrPort(p.Target(m)); got[k] != want {
			t.Errorf("%v goes to %v, want %v", k, got[k], want)
		}
	}
	if len(got) != p.Mappings.Len() {
		t.Errorf("%d elements for %d mappings", len(got), p.Mappings.Len())
	}
}
