package nftables

import (
	"net"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

// Which plans are flat, and which keep a chain of rules.
func TestIsFlat(t *testing.T) {
	many := fixture.Attachment("m", "192.0.2.2/24")
	for port := range flatMax + 1 {
		many.Mappings.Add(plan.Mapping{HostPort: 20000 + 2*port, ContainerPort: 80, Protocol: plan.TCP})
	}
	for _, tt := range []struct {
		name string
		p    *plan.Plan
		flat bool
	}{
		{"single ports", fixture.Attachment("a", "192.0.2.2/24", 8080, 8081), true},
		{"snat off", build(plan.IPv4, func(r *plan.Request) { r.Masquerade.Enabled = false }), true},
		{"masqAll", build(plan.IPv4, func(r *plan.Request) { r.Masquerade.All = true }), true},
		{"another mark bit", build(plan.IPv4, func(r *plan.Request) { r.Masquerade.MarkBit = 14 }), false},
		{"conditions", build(plan.IPv4, func(r *plan.Request) { r.ConditionsV4 = []string{"ip saddr != 10.0.0.0/8"} }), false},
		{"an identity range", build(plan.IPv4, smallRanges), false},
		{"more than flatMax mappings", many, false},
	} {
		if got := layoutOf(tt.p).flat; got != tt.flat {
			t.Errorf("%s: flat %v, want %v", tt.name, got, tt.flat)
		}
	}
}

// A flat attachment forwards, marks its hairpin and localhost
// connections, and holds its ports by its elements' comments: a newer
// ADD of a port takes its DNAT and hairpin elements, DEL (without
// mappings, by its claim rules) removes only its own, and the last DEL leaves
// the skeleton alone.
func TestFlatOwnership(t *testing.T) {
	b, m := memBackend()
	a := fixture.Attachment("a", "192.0.2.2/24", 8080, 8081)
	c := fixture.Attachment("c", "192.0.2.3/24", 8080)
	if err := b.Apply(a); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(a); err != nil {
		t.Fatalf("CHECK a: %v", err)
	}
	for _, tt := range []struct {
		name string
		src  net.IP
		host bool
		masq bool
	}{
		{"remote", fixture.Remote, false, false},
		{"hairpin", net.ParseIP("192.0.2.9").To4(), false, true},
		{"localhost", net.ParseIP("127.0.0.1").To4(), true, true},
	} {
		dst := fixture.HostIP
		if tt.host {
			dst = net.ParseIP("127.0.0.1").To4()
		}
		got := trace(t, m, plan.TCP, tt.src, dst, 8080, tt.host)
		if got.DNAT != "192.0.2.2:80" || got.Masquerade != tt.masq {
			t.Errorf("%s: %+v, want a's 192.0.2.2:80, masquerade %v", tt.name, got, tt.masq)
		}
	}

	if err := b.Apply(c); err != nil {
		t.Fatal(err)
	}
	if got := trace(t, m, plan.TCP, net.ParseIP("192.0.2.9").To4(), fixture.HostIP, 8080, false); got.DNAT != "192.0.2.3:80" || !got.Masquerade {
		t.Errorf("8080 after c's ADD: %+v, want c's, masqueraded", got)
	}
	if err := b.Check(a); err == nil || !strings.Contains(err.Error(), "8080") {
		t.Errorf("CHECK a after c took 8080: %v, want the port named", err)
	}
	st, _ := m.Table(plan.IPv4, Table)
	for _, h := range st.Hairpins {
		if h.Key.Port == 8080 && h.Chain != ChainName(c.Owner) {
			t.Errorf("a hairpin element of 8080 stays with %s", h.Chain)
		}
	}

	noMappings := func(p *plan.Plan) *plan.Plan {
		return plan.Build(plan.Request{Owner: p.Owner, Masquerade: p.Masquerade}, plan.IPv4, nil)
	}
	if err := b.Remove(noMappings(a)); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(c); err != nil {
		t.Errorf("CHECK c after a's DEL: %v", err)
	}
	if got := trace(t, m, plan.TCP, fixture.Remote, fixture.HostIP, 8081, false); got.DNAT != "" {
		t.Errorf("a's 8081 after its DEL without mappings: %+v", got)
	}
	if err := b.Remove(noMappings(c)); err != nil {
		t.Fatal(err)
	}
	if d := m.Dump(); strings.Contains(d, "dn-") || strings.Contains(d, "comment") || strings.Contains(d, "record") {
		t.Errorf("left after the last DEL:\n%s", d)
	}
}

// A port moves between the two kinds of attachment: a chain attachment's
// ADD takes it from a flat one's DNAT map (with its hairpin elements),
// and a flat one's takes it back from the verdict map, which the dispatch
// chain looks up first.
func TestFlatAndChainTakeOver(t *testing.T) {
	b, m := memBackend()
	f := fixture.Attachment("f", "192.0.2.2/24", 8080)
	c := fixture.Attachment("c", "192.0.2.3/24", 8080)
	c.Masquerade.MarkBit = 14
	g := fixture.Attachment("g", "192.0.2.4/24", 8080)
	for i, step := range []struct {
		p    *plan.Plan
		want string
	}{{f, "192.0.2.2:80"}, {c, "192.0.2.3:80"}, {g, "192.0.2.4:80"}} {
		if err := b.Apply(step.p); err != nil {
			t.Fatal(err)
		}
		if got := trace(t, m, plan.TCP, fixture.Remote, fixture.HostIP, 8080, false); got.DNAT != step.want {
			t.Errorf("step %d: 8080 goes to %q, want %s", i, got.DNAT, step.want)
		}
		if err := b.Check(step.p); err != nil {
			t.Errorf("step %d: CHECK of the newest: %v", i, err)
		}
		els, _ := m.elements(Key{Protocol: plan.TCP, Port: 8080}, Key{Protocol: plan.TCP, Port: 8080, Flat: true})
		if len(els) != 1 || els[0].Chain != ChainName(step.p.Owner) {
			t.Errorf("step %d: elements of 8080 %v, want one, the newest's", i, els)
		}
	}
	st, _ := m.Table(plan.IPv4, Table)
	for _, h := range st.Hairpins {
		if h.Chain != ChainName(g.Owner) {
			t.Errorf("hairpin element %s of %s stays", h, h.Chain)
		}
	}
}

// What CHECK names of a flat attachment, and what sync repairs: a DNAT
// element, a hairpin element, its claim rules.
func TestFlatTampering(t *testing.T) {
	a := fixture.Attachment("a", "192.0.2.2/24", 8080)
	own := ChainName(a.Owner)
	k := layoutOf(a).keys[0]
	for _, tt := range []struct {
		name, want string
		tamper     func(tx *nft.Tx)
	}{
		{"DNAT element", "missing element tcp . 8080 in map hostport_dnat", func(tx *nft.Tx) { tx.Delete(Element{Key: k}) }},
		{"hairpin element", "set hairpin_24 has no element 192.0.2.0/24 . tcp . 8080", func(tx *nft.Tx) {
			tx.Delete(hairpinObj{Hairpin{Src: "192.0.2.0/24", Key: k}})
		}},
		{"localhost element", "set hairpin_32 has no element 127.0.0.1/32 . tcp . 8080", func(tx *nft.Tx) {
			tx.Delete(hairpinObj{Hairpin{Src: "127.0.0.1/32", Key: k}})
		}},
		{"claim", "does not claim tcp . 8080", func(tx *nft.Tx) {
			tx.Flush(&nft.Chain{Name: own})
			tx.Add(claimRules(own, []Key{{Protocol: plan.TCP, Port: 9090, Flat: true}})[0])
		}},
		{"claims gone", "claims no key", func(tx *nft.Tx) { tx.Flush(&nft.Chain{Name: own}) }},
		{"owners element", "map owners holds no element for chain " + own, func(tx *nft.Tx) { tx.Delete(ownerObj{own}) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, m := memBackend()
			if err := b.Apply(a); err != nil {
				t.Fatal(err)
			}
			want := m.Dump()
			tx := newTx(plan.IPv4)
			tt.tamper(tx)
			if err := m.Apply(tx); err != nil {
				t.Fatal(err)
			}
			if err := b.Check(a); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CHECK: %v, want %q", err, tt.want)
			}
			rep, err := b.Sync([]*plan.Plan{a}, converge.Options{})
			if err != nil || rep.Results[0].State != converge.Repaired {
				t.Fatalf("sync: %+v, %v", rep, err)
			}
			if got := m.Dump(); got != want {
				t.Errorf("after sync:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// The record's gotos hold the chain: a DEL that deletes the chain alone
// (an older release's, rolled back to) fails and changes nothing.
func TestFlatClaimsHoldTheChain(t *testing.T) {
	b, m := memBackend()
	a := fixture.Attachment("a", "192.0.2.2/24", 8080)
	if err := b.Apply(a); err != nil {
		t.Fatal(err)
	}
	before := m.Dump()
	tx := newTx(plan.IPv4)
	tx.Flush(&nft.Chain{Name: ChainName(a.Owner)})
	tx.Delete(&nft.Chain{Name: ChainName(a.Owner)})
	if err := m.Apply(tx); err == nil || !strings.Contains(err.Error(), unix.EBUSY.Error()) {
		t.Errorf("deleting a flat attachment's chain alone: %v, want EBUSY", err)
	}
	if m.Dump() != before {
		t.Error("the failed DEL changed the state")
	}
}

// A node with flat attachments of one hairpin prefix length: an
// attachment of another length goes the slow way once, which writes its
// hairpin sets and keeps the lookups of the first length.
func TestFlatNewPrefixLength(t *testing.T) {
	b, m := memBackend()
	a := fixture.Attachment("a", "192.0.2.2/24", 8080)
	c := fixture.Attachment("c", "10.1.2.3/23", 8081)
	for _, p := range []*plan.Plan{a, c} {
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*plan.Plan{a, c} {
		if err := b.Check(p); err != nil {
			t.Errorf("CHECK %s: %v", p.Owner.ContainerID, err)
		}
	}
	d := m.chain(DispatchChain)
	if got := lengthsOf(d); len(got) != 3 || got[0] != 32 || got[1] != 24 || got[2] != 23 {
		t.Errorf("dispatch looks up hairpin lengths %v, want [32 24 23]", got)
	}
	if got := trace(t, m, plan.TCP, net.ParseIP("10.1.3.200").To4(), fixture.HostIP, 8081, false); !got.Masquerade {
		t.Errorf("a hairpin connection of the /23: %+v, want masqueraded", got)
	}
	if got := trace(t, m, plan.TCP, net.ParseIP("10.1.4.1").To4(), fixture.HostIP, 8081, false); got.Masquerade {
		t.Errorf("a connection from outside the /23: %+v, want not masqueraded", got)
	}
}

// TestFlatDelAfterTampering: DEL of a flat attachment whose DNAT element
// was deleted by hand (or by a flush of its map) still removes the
// hairpin and localhost-mark elements of that key, with or without the
// prevResult, and with every DNAT element gone; another attachment's
// elements stay.
func TestFlatDelAfterTampering(t *testing.T) {
	a := fixture.Attachment("a", "192.0.2.2/24", 8080, 8081)
	other := fixture.Attachment("o", "192.0.2.9/24", 9090)
	own := ChainName(a.Owner)
	for _, tt := range []struct {
		name     string
		gone     []int // which of a's keys lose their DNAT element
		noResult bool  // DEL without prevResult: no container address
	}{
		{"one element gone", []int{0}, false},
		{"one element gone, no prevResult", []int{0}, true},
		{"every element gone, no prevResult", []int{0, 1}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, m := memBackend()
			if err := b.Apply(other); err != nil {
				t.Fatal(err)
			}
			want := m.Dump()
			if err := b.Apply(a); err != nil {
				t.Fatal(err)
			}
			tx := newTx(plan.IPv4)
			for _, i := range tt.gone {
				tx.Delete(Element{Key: layoutOf(a).keys[i]})
			}
			if err := m.Apply(tx); err != nil {
				t.Fatal(err)
			}
			del := a
			if tt.noResult {
				c := *a
				c.ContainerNet = nil
				del = &c
			}
			if err := b.Remove(del); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if got := m.Dump(); got != want {
				t.Errorf("after DEL (%s's elements should be gone):\n%s\nwant:\n%s", own, got, want)
			}
		})
	}
}
