package nftables

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

func TestSubtract(t *testing.T) {
	k := func(from, to int) Key {
		key := Key{Protocol: plan.TCP, Port: from}
		if to > from {
			key.Last = to
		}
		return key
	}
	udp := k(20000, 20009)
	udp.Protocol = plan.UDP
	onIP := k(20000, 20009)
	onIP.HostIP = netip.MustParseAddr("198.51.100.1")
	tests := []struct {
		name string
		cut  []Key
		want string
	}{
		{"nothing cut", nil, "[tcp . 20000-20099]"},
		{"the start", []Key{k(19990, 20009)}, "[tcp . 20010-20099]"},
		{"the end", []Key{k(20090, 20200)}, "[tcp . 20000-20089]"},
		{"the middle", []Key{k(20010, 20019)}, "[tcp . 20000-20009 tcp . 20020-20099]"},
		{"all", []Key{k(19000, 21000)}, "[]"},
		{"exactly", []Key{k(20000, 20099)}, "[]"},
		{"one port left at each end", []Key{k(20001, 20098)}, "[tcp . 20000 tcp . 20099]"},
		{"two holes, unsorted", []Key{k(20050, 20059), k(20010, 20019)}, "[tcp . 20000-20009 tcp . 20020-20049 tcp . 20060-20099]"},
		{"holes that touch", []Key{k(20010, 20019), k(20020, 20029)}, "[tcp . 20000-20009 tcp . 20030-20099]"},
		{"a key of one port", []Key{k(20000, 0)}, "[tcp . 20001-20099]"},
		{"another protocol", []Key{udp}, "[tcp . 20000-20099]"},
		{"another host IP kind", []Key{onIP}, "[tcp . 20000-20099]"},
	}
	for _, tt := range tests {
		if got := fmt.Sprint(subtract(k(20000, 20099), tt.cut)); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

// rangePlan is an attachment of container id at ip forwarding spans of
// TCP host ports [first, last] to the same container ports.
func rangePlan(id, ip string, spans ...[2]int) *plan.Plan {
	p := fixture.TestPlan(plan.IPv4, func(r *plan.Request) {
		r.Owner.ContainerID = id
		r.Mappings = plan.Mappings{}
		for _, s := range spans {
			for _, m := range fixture.Span(plan.TCP, s[0], s[0], s[1]-s[0]+1) {
				r.Mappings.Add(m)
			}
		}
	})
	addr, n, err := net.ParseCIDR(ip)
	if err != nil {
		panic(err)
	}
	n.IP = addr.To4()
	p.ContainerNet = n
	return p
}

// Ownership of interval keys on the in-memory kernel: the newest ADD wins
// each port, a single port shadows an interval, an interval cut by a
// newer one keeps its other ports, CHECK names the port lost, DEL
// removes only its own elements, and each port goes where the last
// writer of it says.
func TestRangeOwnership(t *testing.T) {
	a := rangePlan("a", "192.0.2.2/24", [2]int{20000, 20099})
	b := rangePlan("b", "192.0.2.3/24", [2]int{20040, 20059})
	c := fixture.Attachment("c", "192.0.2.4/24", 20070)
	d := rangePlan("d", "192.0.2.5/24", [2]int{20001, 20099})
	to := func(p *plan.Plan) string { return p.ContainerNet.IP.String() }
	type step struct {
		verb string // add, del
		p    *plan.Plan
		// where ports go after the step ("" none), and the CHECKs
		ports map[int]string
		ok    []*plan.Plan
		lost  map[*plan.Plan]string // the port CHECK names
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"an interval cut in the middle, then deleted", []step{
			{"add", a, map[int]string{20000: to(a), 20099: to(a)}, []*plan.Plan{a}, nil},
			{"add", b, map[int]string{20039: to(a), 20040: to(b), 20059: to(b), 20060: to(a)}, []*plan.Plan{b}, map[*plan.Plan]string{a: "tcp . 20040"}},
			{"del", a, map[int]string{20000: "", 20040: to(b), 20060: ""}, []*plan.Plan{b}, nil},
			{"del", b, map[int]string{20040: ""}, nil, nil},
		}},
		{"a single port shadows an interval, and gives it back", []step{
			{"add", a, nil, []*plan.Plan{a}, nil},
			{"add", c, map[int]string{20069: to(a), 20070: to(c), 20071: to(a)}, []*plan.Plan{c}, map[*plan.Plan]string{a: "tcp . 20070"}},
			{"del", c, map[int]string{20070: to(a)}, []*plan.Plan{a}, nil},
		}},
		{"an interval takes over a single port", []step{
			{"add", c, map[int]string{20070: to(c)}, []*plan.Plan{c}, nil},
			{"add", a, map[int]string{20070: to(a)}, []*plan.Plan{a}, map[*plan.Plan]string{c: "tcp . 20070"}},
			{"del", c, map[int]string{20070: to(a)}, []*plan.Plan{a}, nil},
		}},
		{"an interval cut to one port, which a shadowing port keeps", []step{
			{"add", a, nil, []*plan.Plan{a}, nil},
			{"add", d, map[int]string{20000: to(a), 20001: to(d), 20099: to(d)}, []*plan.Plan{d}, map[*plan.Plan]string{a: "tcp . 20001"}},
			{"del", d, map[int]string{20000: to(a), 20001: ""}, nil, nil},
			{"del", a, map[int]string{20000: ""}, nil, nil},
		}},
		{"the older DELs first", []step{
			{"add", a, nil, nil, nil},
			{"add", b, nil, nil, nil},
			{"add", c, nil, nil, nil},
			{"del", a, map[int]string{20000: "", 20045: to(b), 20070: to(c)}, []*plan.Plan{b, c}, nil},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be, m := memBackend()
			for i, s := range tt.steps {
				var err error
				if s.verb == "add" {
					err = be.Apply(s.p)
				} else {
					err = be.Remove(s.p)
				}
				if err != nil {
					t.Fatalf("step %d: %s %s: %v", i, s.verb, s.p.Owner.ContainerID, err)
				}
				for port, want := range s.ports {
					got := trace(t, m, plan.TCP, fixture.Remote, fixture.HostIP, port, false).DNAT
					if host, _, err := net.SplitHostPort(got); err == nil {
						got = host
					}
					if got != want {
						t.Errorf("step %d: port %d goes to %q, want %q", i, port, got, want)
					}
				}
				for _, p := range s.ok {
					if err := be.Check(p); err != nil {
						t.Errorf("step %d: CHECK %s: %v", i, p.Owner.ContainerID, err)
					}
				}
				for p, port := range s.lost {
					if err := be.Check(p); err == nil || !strings.Contains(err.Error(), port+" ") {
						t.Errorf("step %d: CHECK %s: %v, want %s named", i, p.Owner.ContainerID, err, port)
					}
				}
			}
			st, _ := m.Table(plan.IPv4, Table)
			for k, e := range st.Elements {
				if _, ok := st.Chains[e.Chain]; !ok {
					t.Errorf("element %s names a deleted chain %s", k, e.Chain)
				}
			}
		})
	}
}

// A plan whose intervals change, re-ADDed: what it no longer claims goes,
// and a second ADD of the same plan changes nothing.
func TestRangeReAdd(t *testing.T) {
	be, m := memBackend()
	first := rangePlan("a", "192.0.2.2/24", [2]int{20000, 20099}, [2]int{30000, 30000})
	second := rangePlan("a", "192.0.2.2/24", [2]int{20050, 20149})
	for _, p := range []*plan.Plan{first, second} {
		if err := be.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	dump := m.Dump()
	if err := be.Apply(second); err != nil {
		t.Fatal(err)
	}
	if m.Dump() != dump {
		t.Errorf("a second ADD of the same plan changed the state")
	}
	if err := be.Check(second); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	st, _ := m.Table(plan.IPv4, Table)
	if got := fmt.Sprint(elementsOfState(st)); got != "[{tcp . 20050-20149 "+ChainName(second.Owner)+"}]" {
		t.Errorf("elements %s, want the one interval of the second plan", got)
	}
}

// dropRangeLookups leaves the dispatch chain without its interval
// lookups, and deletes the maps named.
func dropRangeLookups(t *testing.T, m *Memory, maps ...string) {
	t.Helper()
	tx := newTx(plan.IPv4)
	tx.Flush(&nft.Chain{Name: DispatchChain})
	for _, r := range dispatchRules(nil) {
		if v, ok := r.Stmts[0].(vmapLookup); !ok || !v.interval {
			tx.Add(r)
		}
	}
	for _, name := range maps {
		tx.Delete(&nft.Set{Name: name})
	}
	if err := m.Apply(tx); err != nil {
		t.Fatal(err)
	}
}

// CHECK of an interval when the dispatch chain lost the interval lookups
// names one.
func TestRangeCheckNamesTheLookup(t *testing.T) {
	be, m := memBackend()
	p := rangePlan("a", "192.0.2.2/24", [2]int{20000, 20009})
	if err := be.Apply(p); err != nil {
		t.Fatal(err)
	}
	dropRangeLookups(t, m)
	if err := be.Check(p); err == nil || !strings.Contains(err.Error(), "hostport_ranges\" in chain dispatch") {
		t.Errorf("CHECK: %v, want the missing lookup named", err)
	}
}

// sync after a flush puts back the intervals as ADD left them — pieces
// of a cut interval included — and a second pass writes nothing; and a
// wrong interval (another chain's) is repaired.
func TestRangeSync(t *testing.T) {
	be, m := memBackend()
	a := rangePlan("a", "192.0.2.2/24", [2]int{20000, 20099})
	b := rangePlan("b", "192.0.2.3/24", [2]int{20040, 20059})
	c := fixture.Attachment("c", "192.0.2.4/24", 20070)
	want := []*plan.Plan{a, b, c}
	for _, p := range want {
		if err := be.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	traces := func() string {
		var out []string
		for _, port := range []int{20000, 20039, 20040, 20059, 20060, 20070, 20099} {
			out = append(out, fmt.Sprintf("%d:%s", port, trace(t, m, plan.TCP, fixture.Remote, fixture.HostIP, port, false).DNAT))
		}
		return strings.Join(out, " ")
	}
	afterAdd := traces()
	m.FlushRuleset()
	rep, err := be.Sync(want, converge.Options{})
	if err != nil || !rep.Wrote {
		t.Fatalf("sync: %+v, %v", rep, err)
	}
	if got := traces(); got != afterAdd {
		t.Errorf("after sync: %s\nwant as after ADD: %s", got, afterAdd)
	}
	for _, p := range []*plan.Plan{b, c} {
		if err := be.Check(p); err != nil {
			t.Errorf("CHECK %s after sync: %v", p.Owner.ContainerID, err)
		}
	}
	n := m.Committed()
	if rep, err := be.Sync(want, converge.Options{}); err != nil || rep.Wrote || m.Committed() != n {
		t.Errorf("a second pass wrote: %+v, %v", rep, err)
	}

	// b's interval sent to a: sync gives it back to b
	tx := newTx(plan.IPv4)
	k := layoutOf(b).keys[0]
	tx.Delete(Element{Key: k})
	tx.Add(Element{Key: k, Chain: ChainName(a.Owner)})
	if err := m.Apply(tx); err != nil {
		t.Fatal(err)
	}
	rep, err = be.Sync(want, converge.Options{})
	if err != nil || rep.Results[1].State != converge.Repaired {
		t.Fatalf("sync of a stolen interval: %+v, %v", rep, err)
	}
	if got := traces(); got != afterAdd {
		t.Errorf("after the repair: %s\nwant: %s", got, afterAdd)
	}
}

// An interval cut down to a port a newer flat attachment holds: neither
// ADD nor a pass's repair adds that port back for the interval's owner
// (an element of one port in the verdict map would shadow the flat one),
// and a second pass writes nothing. The port left lies beside the new
// interval, on either side; a short interval's ADD asks for its ports
// and those two one by one, and lists no map of one port beside the
// node's other flat attachments, a long one's reads those maps whole.
func TestRangeCutBesideAFlatPort(t *testing.T) {
	const first = 20000
	tests := []struct {
		name  string
		last  int
		atEnd bool // the port left is the old interval's last, not its first
	}{
		{"long, first port left", first + 99, false},
		{"long, last port left", first + 99, true},
		{"short, first port left", first + 9, false},
		{"short, last port left", first + 9, true},
	}
	var others []*plan.Plan // flat attachments on ports away from the interval
	for i := range 20 {
		others = append(others, fixture.Attachment(fmt.Sprintf("other%d", i), fmt.Sprintf("192.0.2.%d/24", 100+i), 30000+i))
	}
	for _, tt := range tests {
		a := rangePlan("a", "192.0.2.2/24", [2]int{first, tt.last})
		left, d := first, rangePlan("d", "192.0.2.5/24", [2]int{first + 1, tt.last})
		if tt.atEnd {
			left, d = tt.last, rangePlan("d", "192.0.2.5/24", [2]int{first, tt.last - 1})
		}
		c := fixture.Attachment("c", "192.0.2.4/24", left)
		want := map[int]string{left: "192.0.2.4:80"}
		for _, port := range []int{first, first + 1, tt.last - 1, tt.last} {
			if port != left {
				want[port] = fmt.Sprintf("192.0.2.5:%d", port)
			}
		}
		holds := func(t *testing.T, m *Memory) {
			t.Helper()
			for port, to := range want {
				got := trace(t, m, plan.TCP, fixture.Remote, fixture.HostIP, port, false).DNAT
				if got != to {
					t.Errorf("port %d goes to %q, want %s", port, got, to)
				}
			}
		}
		t.Run(tt.name+"/ADD", func(t *testing.T) {
			be, m := memBackend()
			for _, p := range append(others[:len(others):len(others)], a, c) {
				if err := be.Apply(p); err != nil {
					t.Fatal(err)
				}
			}
			listed := m.Listed()
			if err := be.Apply(d); err != nil {
				t.Fatal(err)
			}
			holds(t, m)
			// the interval map's one element (a's) is all a short
			// interval's read lists; a long one lists the flat maps too
			if n := m.Listed() - listed; tt.last-first < 10 && n != 1 || tt.last-first >= 10 && n <= len(others) {
				t.Errorf("the ADD's read listed %d elements", n)
			}
			if err := be.Check(d); err != nil {
				t.Errorf("CHECK d: %v", err)
			}
		})
		t.Run(tt.name+"/a pass", func(t *testing.T) {
			be, m := memBackend()
			for _, p := range []*plan.Plan{a, c} {
				if err := be.Apply(p); err != nil {
					t.Fatal(err)
				}
			}
			all := []*plan.Plan{a, c, d}
			if rep, err := be.Sync(all, converge.Options{}); err != nil || rep.Results[2].State != converge.Repaired {
				t.Fatalf("sync: %+v, %v", rep, err)
			}
			holds(t, m)
			n := m.Committed()
			if rep, err := be.Sync(all, converge.Options{}); err != nil || rep.Wrote || m.Committed() != n {
				t.Errorf("a second pass wrote: %+v, %v", rep, err)
			}
		})
	}
}

// An interval that takes a flat attachment's port over takes the port's
// hairpin elements away with its DNAT element, on the fast path (a new
// attachment) as on the slow one (ADD again): left, they would mark the
// new holder's connections from the old one's sources for masquerading.
func TestRangeTakesAFlatPortsHairpins(t *testing.T) {
	a := rangePlan("a", "192.0.2.2/24", [2]int{20000, 20099})
	c := fixture.Attachment("c", "192.0.2.4/24", 20070)
	cChain := ChainName(c.Owner)
	for _, again := range []bool{false, true} {
		be, m := memBackend()
		if again {
			if err := be.Apply(a); err != nil {
				t.Fatal(err)
			}
		}
		if err := be.Apply(c); err != nil {
			t.Fatal(err)
		}
		if d := m.Dump(); strings.Count(d, "hairpin hairpin_") != 2 || !strings.Contains(d, "comment "+cChain) {
			t.Fatalf("c's hairpin elements after its ADD:\n%s", d)
		}
		if err := be.Apply(a); err != nil {
			t.Fatal(err)
		}
		if d := m.Dump(); strings.Contains(d, "hairpin hairpin_") {
			t.Errorf("ADD again %v: hairpin elements of c's port left after a took it over:\n%s", again, d)
		}
		if err := be.Check(a); err != nil {
			t.Errorf("ADD again %v: CHECK a: %v", again, err)
		}
		if err := be.Check(c); err == nil || !strings.Contains(err.Error(), "tcp . 20070") {
			t.Errorf("ADD again %v: CHECK c: %v, want its port named", again, err)
		}
	}
}
