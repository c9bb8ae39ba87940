package socket

import (
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

const nodeNS, otherNS = 4097, 8193

func owner(id string) plan.Owner { return plan.Owner{Network: "net1", ContainerID: id, IfName: "eth0"} }

func pl(f plan.Family, id, ip string, ms ...plan.Mapping) *plan.Plan {
	bits := 24
	if f == plan.IPv6 {
		bits = 128
	}
	p := &plan.Plan{Family: f, Owner: owner(id), Mappings: plan.MappingsOf(ms...), Localhost: plan.LocalhostSocket}
	if ip != "" {
		p.ContainerNet = &net.IPNet{IP: net.ParseIP(ip), Mask: net.CIDRMask(bits, 8*len(net.ParseIP(ip).To16()))}
		if f == plan.IPv4 {
			p.ContainerNet.IP = p.ContainerNet.IP.To4()
			p.ContainerNet.Mask = net.CIDRMask(bits, 32)
		}
	}
	return p
}

func tcp(port int) plan.Mapping {
	return plan.Mapping{HostPort: port, ContainerPort: 80, Protocol: plan.TCP}
}

func at(hostIP string, m plan.Mapping) plan.Mapping { m.HostIP = net.ParseIP(hostIP); return m }

func newLayer(f plan.Family, m *Memory) *Layer {
	return &Layer{Family: f, Site: m, Netns: func() (uint64, error) { return nodeNS, nil },
		Lock: func() (func(), error) { return func() {}, nil }}
}

func key(addr string, port int, proto plan.Protocol) Key {
	return Key{Netns: nodeNS, Addr: addr16(net.ParseIP(addr)), Port: uint16(port), Protocol: proto}
}

// The bytes the programs read: the netns cookie, the address as 16
// bytes (IPv4 v4-mapped), the port in network order, the protocol number.
func TestEncoding(t *testing.T) {
	k := key("127.0.0.1", 8080, plan.UDP)
	r := k.raw()
	if binary.LittleEndian.Uint64(r[0:]) != nodeNS {
		t.Errorf("cookie bytes % x", r[0:8])
	}
	if want := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}; string(r[8:24]) != string(want) {
		t.Errorf("address bytes % x, want % x", r[8:24], want)
	}
	if r[24] != 0x1f || r[25] != 0x90 || r[26] != 0 || r[27] != 0 {
		t.Errorf("port bytes % x, want 1f 90 00 00", r[24:28])
	}
	if binary.LittleEndian.Uint32(r[28:]) != 17 {
		t.Errorf("protocol bytes % x", r[28:])
	}
	if got := r.key(); got != k {
		t.Errorf("key round trip: %+v, want %+v", got, k)
	}
	v := Value{Addr: addr16(net.ParseIP("2001:db8::2")), Port: 80, Rank: RankExact, Owner: 7, Network: 9}
	rv := v.raw()
	if rv[16] != 0 || rv[17] != 80 {
		t.Errorf("value port bytes % x", rv[16:20])
	}
	if got := rv.value(); got != v {
		t.Errorf("value round trip: %+v, want %+v", got, v)
	}
	for _, o := range []plan.Owner{owner("c1"), {Network: strings.Repeat("n", 200), ContainerID: strings.Repeat("c", 200), IfName: "eth0"}} {
		got := ownerEntry(o).owner()
		if !strings.HasPrefix(o.Network, got.Network) || !strings.HasPrefix(o.ContainerID, got.ContainerID) || len(got.Network)+len(got.ContainerID)+len(got.IfName) > ownerSize-4 {
			t.Errorf("owner entry of %q/%q: %+v", o.Network[:8], o.ContainerID[:2], got)
		}
		if len(o.Network) < 100 && got != o {
			t.Errorf("owner round trip: %+v, want %+v", got, o)
		}
	}
	if OwnerID(owner("c1")) == OwnerID(plan.Owner{Network: "net1c", ContainerID: "1", IfName: "eth0"}) {
		t.Error("owner IDs run the parts together")
	}
}

func TestEntries(t *testing.T) {
	sctp := plan.Mapping{HostPort: 9, ContainerPort: 9, Protocol: plan.SCTP}
	cases := []struct {
		name string
		p    *plan.Plan
		want []string
	}{
		{"wildcard v4 at 127.0.0.1 only", pl(plan.IPv4, "c1", "192.0.2.2", tcp(8080)), []string{"127.0.0.1:8080/tcp 192.0.2.2:80 1"}},
		{"wildcard v6 at ::1", pl(plan.IPv6, "c1", "2001:db8::2", tcp(8080)), []string{"[::1]:8080/tcp [2001:db8::2]:80 1"}},
		{"a loopback host IP", pl(plan.IPv4, "c1", "192.0.2.2", at("127.0.0.53", tcp(53))),
			[]string{"127.0.0.53:53/tcp 192.0.2.2:80 2"}},
		{"host IPs that are not loopback are not served, the node's own neither", pl(plan.IPv4, "c1", "192.0.2.2", at("203.0.113.9", tcp(8090)),
			at("169.254.169.254", tcp(80)), at("224.0.0.251", tcp(5353)), at("255.255.255.255", tcp(67)), at("10.0.0.2", tcp(80)), at("10.0.0.1", tcp(81))),
			nil},
		{"nor in IPv6", pl(plan.IPv6, "c1", "2001:db8::2", at("2001:db8:ff::9", tcp(8090)), at("fe80::1", tcp(80)), at("ff02::1", tcp(80)), at("::1", tcp(53)), at("2001:db8:2::1", tcp(81))),
			[]string{"[::1]:53/tcp [2001:db8::2]:80 2"}},
		{"SCTP keeps the DNAT path", pl(plan.IPv4, "c1", "192.0.2.2", sctp), nil},
		{"a key twice keeps the first", pl(plan.IPv4, "c1", "192.0.2.2", tcp(8080), plan.Mapping{HostPort: 8080, ContainerPort: 81, Protocol: plan.TCP}),
			[]string{"127.0.0.1:8080/tcp 192.0.2.2:80 1"}},
		{"DEL without prevResult names the keys", pl(plan.IPv4, "c1", "", tcp(8080)), []string{"127.0.0.1:8080/tcp [::]:80 1"}},
	}
	for _, c := range cases {
		var got []string
		for _, e := range Entries(c.p, nodeNS) {
			if e.Value.Owner != OwnerID(c.p.Owner) || e.Value.Network != NetworkID("net1") {
				t.Errorf("%s: owner not recorded: %+v", c.name, e.Value)
			}
			got = append(got, e.Key.String()+" "+e.Value.Target()+" "+string(rune('0'+e.Value.Rank)))
		}
		if strings.Join(got, ";") != strings.Join(c.want, ";") {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}

func holder(t *testing.T, m *Memory, k Key) string {
	t.Helper()
	v, ok := m.Entries[k]
	if !ok {
		return "-"
	}
	o, ok := m.Owners[OwnerKey{k.Netns, k.Family(), v.Owner}]
	if !ok {
		t.Fatalf("entry %s names owner %x without an owner entry", k, v.Owner)
	}
	return o.ContainerID + "→" + v.Target()
}

// Newest wins within a rank, an exact host IP over a wildcard, DEL takes
// only its own, CHECK names who has the key.
func TestOwnership(t *testing.T) {
	m := NewMemory()
	l := newLayer(plan.IPv4, m)
	k := key("127.0.0.1", 8080, plan.TCP)
	a := pl(plan.IPv4, "a", "192.0.2.2", tcp(8080))
	b := pl(plan.IPv4, "b", "192.0.2.3", tcp(8080))
	c := pl(plan.IPv4, "c", "192.0.2.4", at("127.0.0.1", tcp(8080)))
	d := pl(plan.IPv4, "d", "192.0.2.5", tcp(8080))
	step := func(what string, err error, want string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := holder(t, m, k); got != want {
			t.Fatalf("after %s: %s holds %s, want %s", what, k, got, want)
		}
	}
	step("ADD a", l.Apply(a), "a→192.0.2.2:80")
	if err := l.Check(a); err != nil {
		t.Errorf("CHECK a: %v", err)
	}
	step("ADD b", l.Apply(b), "b→192.0.2.3:80")
	if err := l.Check(a); err == nil || !strings.Contains(err.Error(), "container b") {
		t.Errorf("CHECK a after b took the port: %v, want it to name b", err)
	}
	step("DEL a", l.Remove(a), "b→192.0.2.3:80")
	if err := l.Check(b); err != nil {
		t.Errorf("CHECK b: %v", err)
	}
	step("ADD c (exact 127.0.0.1)", l.Apply(c), "c→192.0.2.4:80")
	if err := l.Check(b); err != nil {
		t.Errorf("CHECK b shadowed by an exact host IP: %v, want ok (the NAT path shadows it alike)", err)
	}
	step("ADD d (wildcard, newer)", l.Apply(d), "c→192.0.2.4:80")
	step("DEL c", l.Remove(c), "-")
	if _, ok := m.Owners[OwnerKey{nodeNS, plan.IPv4, OwnerID(c.Owner)}]; ok {
		t.Error("owner entry of c outlived its entries")
	}
	if err := l.Check(d); err == nil || !strings.Contains(err.Error(), "no entry") {
		t.Errorf("CHECK d with its key gone: %v", err)
	}
	// sync gives the key to the newest wildcard claimant
	rep, err := l.Sync([]*plan.Plan{b, d}, converge.Options{})
	step("sync", err, "d→192.0.2.5:80")
	if rep.Results[1].State != converge.Repaired || rep.Results[0].State != converge.OK {
		t.Errorf("sync results %+v", rep.Results)
	}
	// re-ADD with other ports replaces what the attachment held
	step("re-ADD d on 9090", l.Apply(pl(plan.IPv4, "d", "192.0.2.5", tcp(9090))), "-")
	if got := holder(t, m, key("127.0.0.1", 9090, plan.TCP)); got != "d→192.0.2.5:80" {
		t.Errorf("9090 held by %s", got)
	}
	// DEL is idempotent and works without prevResult
	for i := 0; i < 2; i++ {
		if err := l.Remove(pl(plan.IPv4, "d", "", tcp(9090))); err != nil {
			t.Fatal(err)
		}
	}
	if len(m.Entries) != 0 || len(m.Owners) != 0 {
		t.Errorf("left after every DEL: %v %v", m.Entries, m.Owners)
	}
}

// ADD reads only its own keys and owner entry where the attachment
// holds nothing and none of its keys is held: no dump of the maps. A
// second ADD of the attachment, or one that takes a key over, reads the
// family whole, so that what the attachment held elsewhere goes, and
// the entry of an owner left with nothing.
func TestApplyReads(t *testing.T) {
	m := NewMemory()
	l := newLayer(plan.IPv4, m)
	step := func(what string, p *plan.Plan, reads int) {
		t.Helper()
		m.Reads = 0
		if err := l.Apply(p); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if m.Reads != reads {
			t.Errorf("%s: %d whole reads, want %d", what, m.Reads, reads)
		}
	}
	step("ADD a", pl(plan.IPv4, "a", "192.0.2.2", tcp(8080)), 0)
	step("ADD b beside it", pl(plan.IPv4, "b", "192.0.2.3", tcp(8081)), 0)
	step("re-ADD a on 9090", pl(plan.IPv4, "a", "192.0.2.2", tcp(9090)), 1)
	if got := holder(t, m, key("127.0.0.1", 8080, plan.TCP)); got != "-" {
		t.Errorf("8080 after a moved to 9090: held by %s", got)
	}
	step("ADD c taking b's port", pl(plan.IPv4, "c", "192.0.2.4", tcp(8081)), 1)
	if _, ok := m.Owners[OwnerKey{nodeNS, plan.IPv4, OwnerID(owner("b"))}]; ok {
		t.Error("the owner entry of b outlived its last entry")
	}
	if got := holder(t, m, key("127.0.0.1", 8081, plan.TCP)); got != "c→192.0.2.4:80" {
		t.Errorf("8081 held by %s", got)
	}
}

// Each family keeps its keys: DEL of IPv4 leaves the IPv6 entries and the
// owner entry, which goes with the last entry.
func TestFamilies(t *testing.T) {
	m := NewMemory()
	l4, l6 := newLayer(plan.IPv4, m), newLayer(plan.IPv6, m)
	p4, p6 := pl(plan.IPv4, "a", "192.0.2.2", tcp(8080)), pl(plan.IPv6, "a", "2001:db8::2", tcp(8080))
	for _, x := range []struct {
		l *Layer
		p *plan.Plan
	}{{l4, p4}, {l6, p6}} {
		if err := x.l.Apply(x.p); err != nil {
			t.Fatal(err)
		}
	}
	if err := l4.Remove(p4); err != nil {
		t.Fatal(err)
	}
	if holder(t, m, key("::1", 8080, plan.TCP)) != "a→[2001:db8::2]:80" {
		t.Errorf("IPv6 entry lost with the IPv4 DEL: %v", m.Entries)
	}
	if _, ok := m.Owners[OwnerKey{nodeNS, plan.IPv4, OwnerID(p4.Owner)}]; ok || len(m.Owners) != 1 {
		t.Errorf("owner entries after the IPv4 DEL: %v", m.Owners)
	}
	if err := l6.Remove(p6); err != nil {
		t.Fatal(err)
	}
	if len(m.Owners) != 0 {
		t.Errorf("owner entry left: %v", m.Owners)
	}
}

// The first ADD installs the eight hooks; the next one none; a detached
// link is replaced, another build's program updated in place; CHECK names
// a hook that is not right; a host that cannot fails with nothing written.
func TestInstall(t *testing.T) {
	m := NewMemory()
	l := newLayer(plan.IPv4, m)
	p := pl(plan.IPv4, "a", "192.0.2.2", tcp(8080))
	if err := l.Remove(p); err != nil || m.Writes != 0 {
		t.Fatalf("DEL on a site never installed: %v, %d writes", err, m.Writes)
	}
	if err := l.Apply(p); err != nil {
		t.Fatal(err)
	}
	if m.Installs["attach"] != len(Hooks) {
		t.Errorf("first ADD: %v, want %d attaches", m.Installs, len(Hooks))
	}
	if err := l.Apply(pl(plan.IPv4, "b", "192.0.2.3", tcp(8081))); err != nil {
		t.Fatal(err)
	}
	if m.Installs["attach"] != len(Hooks) || len(m.Installs) != 1 {
		t.Errorf("second ADD installed again: %v", m.Installs)
	}
	m.Links["connect4"], m.Links["recvmsg6"] = HookDetached, HookStale
	if err := l.Check(p); err == nil || !strings.Contains(err.Error(), "link connect4 detached") {
		t.Errorf("CHECK with a detached link: %v", err)
	}
	if err := l.Apply(p); err != nil {
		t.Fatal(err)
	}
	if m.Installs["replace"] != 1 || m.Installs["update"] != 1 {
		t.Errorf("repairs: %v, want one replace and one update", m.Installs)
	}
	if err := l.Check(p); err != nil {
		t.Errorf("CHECK after the repair: %v", err)
	}

	bare := NewMemory()
	bare.NotReady = errors.New("socket path: cgroupPath \"/nowhere\": no such file or directory")
	lb := newLayer(plan.IPv4, bare)
	if err := lb.Ready(p); err == nil || !strings.Contains(err.Error(), "/nowhere") {
		t.Errorf("Ready: %v", err)
	}
	if err := lb.Apply(p); err == nil || len(bare.Entries) != 0 || bare.Exists() {
		t.Errorf("Apply on a host that cannot: %v, entries %v", err, bare.Entries)
	}
}

// Only the namespace's own entries are seen and touched.
func TestNetnsScope(t *testing.T) {
	m := NewMemory()
	l := newLayer(plan.IPv4, m)
	p := pl(plan.IPv4, "a", "192.0.2.2", tcp(8080))
	if err := l.Apply(p); err != nil {
		t.Fatal(err)
	}
	foreign := key("127.0.0.1", 8080, plan.TCP)
	foreign.Netns = otherNS
	m.Entries[foreign] = Value{Port: 1, Owner: 99, Network: NetworkID("net1")}
	if err := l.GC("net1", nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Entries[foreign]; !ok {
		t.Error("GC removed another namespace's entry")
	}
	if _, ok := m.Entries[key("127.0.0.1", 8080, plan.TCP)]; ok {
		t.Error("GC kept an entry of an invalid attachment")
	}
	rep, err := l.Sync(nil, converge.Options{Prune: true})
	if err != nil || len(rep.Orphans) != 0 {
		t.Errorf("sync saw another namespace's entry: %+v %v", rep, err)
	}
	if ms, _ := l.Mappings(); len(ms) != 0 {
		t.Errorf("list shows another namespace's entry: %+v", ms)
	}
}

func TestGC(t *testing.T) {
	m := NewMemory()
	l4, l6 := newLayer(plan.IPv4, m), newLayer(plan.IPv6, m)
	keep, drop := pl(plan.IPv4, "keep", "192.0.2.2", tcp(1)), pl(plan.IPv4, "drop", "192.0.2.3", tcp(2))
	other := pl(plan.IPv4, "x", "192.0.2.4", tcp(3))
	other.Owner.Network = "net2"
	drop6 := pl(plan.IPv6, "drop", "2001:db8::3", tcp(2))
	for _, p := range []*plan.Plan{keep, drop, other} {
		if err := l4.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := l6.Apply(drop6); err != nil {
		t.Fatal(err)
	}
	if err := l4.GC("net1", []plan.Owner{keep.Owner}); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for k, v := range m.Entries {
		got[m.Owners[OwnerKey{k.Netns, k.Family(), v.Owner}].ContainerID+"/"+net.IP(v.Addr[:]).String()] = true
	}
	for _, want := range []string{"keep/192.0.2.2", "x/192.0.2.4", "drop/2001:db8::3"} {
		if !got[want] {
			t.Errorf("GC of ipv4 net1 removed %s: %v", want, got)
		}
	}
	if got["drop/192.0.2.3"] {
		t.Error("GC kept the invalid attachment's entry")
	}
	if err := l6.GC("net1", []plan.Owner{keep.Owner}); err != nil {
		t.Fatal(err)
	}
	for k := range m.Owners {
		if k.ID == OwnerID(drop.Owner) {
			t.Errorf("owner entry of a collected attachment left: %+v", k)
		}
	}
}

// sync repairs a flushed map and a detached link, writes nothing the
// second time, reports orphans and prunes them only when asked.
func TestSync(t *testing.T) {
	m := NewMemory()
	l := newLayer(plan.IPv4, m)
	a, b := pl(plan.IPv4, "a", "192.0.2.2", tcp(1), tcp(2)), pl(plan.IPv4, "b", "192.0.2.3", tcp(3))
	gone := pl(plan.IPv4, "gone", "192.0.2.9", tcp(4))
	for _, p := range []*plan.Plan{a, b, gone} {
		if err := l.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	delete(m.Entries, key("127.0.0.1", 2, plan.TCP))
	m.Entries[key("127.0.0.1", 3, plan.TCP)] = Value{Addr: addr16(net.ParseIP("192.0.2.66")), Port: 80, Rank: RankWildcard, Owner: OwnerID(b.Owner), Network: NetworkID("net1")}
	m.Links["sendmsg4"] = HookDetached
	want := []*plan.Plan{a, b}
	rep, err := l.Sync(want, converge.Options{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if m.Writes != 3 || m.Links["sendmsg4"] != HookDetached {
		t.Fatalf("dry run wrote")
	}
	rep, err = l.Sync(want, converge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[0].State != converge.Repaired || !strings.Contains(rep.Results[0].What, "127.0.0.1:2/tcp missing") {
		t.Errorf("a: %+v", rep.Results[0])
	}
	if rep.Results[1].State != converge.Repaired || !strings.Contains(rep.Results[1].What, "went to 192.0.2.66:80") {
		t.Errorf("b: %+v", rep.Results[1])
	}
	if len(rep.Shared) != 1 || !strings.Contains(rep.Shared[0], "sendmsg4 detached") || m.Links["sendmsg4"] != HookOK {
		t.Errorf("shared: %v, link %q", rep.Shared, m.Links["sendmsg4"])
	}
	if len(rep.Orphans) != 1 || rep.Orphans[0].ContainerID != "gone" || rep.Orphans[0].Pruned {
		t.Errorf("orphans without prune: %+v", rep.Orphans)
	}
	writes := m.Writes
	rep, err = l.Sync(want, converge.Options{})
	if err != nil || rep.Wrote || m.Writes != writes {
		t.Errorf("second pass wrote: %+v %v", rep, err)
	}
	rep, err = l.Sync(want, converge.Options{Prune: true, InScope: func(n string) bool { return n != "net1" }})
	if err != nil || len(rep.Orphans) != 0 {
		t.Errorf("out of scope orphan reported: %+v", rep.Orphans)
	}
	rep, err = l.Sync(want, converge.Options{Prune: true})
	if err != nil || len(rep.Orphans) != 1 || !rep.Orphans[0].Pruned {
		t.Fatalf("prune: %+v %v", rep, err)
	}
	if _, ok := m.Owners[OwnerKey{nodeNS, plan.IPv4, OwnerID(gone.Owner)}]; ok || holder(t, m, key("127.0.0.1", 4, plan.TCP)) != "-" {
		t.Error("pruned orphan left its entry or owner entry")
	}
	ms, err := l.Mappings()
	if err != nil || len(ms) != 3 || ms[0].HostIP != nil || ms[0].ContainerIP.String() != "192.0.2.2" || ms[0].Owner.ContainerID != "a" {
		t.Errorf("mappings: %+v %v", ms, err)
	}
}

// Only loopback is served: a host IP that is not loopback, the node's
// own address or another host's, is never put in the maps — ADD writes
// no entry for it, CHECK asks for none and a pass agrees — so the DNAT
// rules judge the node's connections to it packet by packet (an address
// that moves to another host is left at once). A loopback host IP other
// than 127.0.0.1 is served at that address.
func TestOnlyLoopback(t *testing.T) {
	m := NewMemory()
	l := newLayer(plan.IPv4, m)
	p := pl(plan.IPv4, "a", "192.0.2.2", at("203.0.113.9", tcp(8090)), at("169.254.169.254", tcp(80)), at("198.51.100.1", tcp(8091)),
		at("127.0.0.53", tcp(53)), tcp(8092))
	if err := l.Apply(p); err != nil {
		t.Fatal(err)
	}
	if len(m.Entries) != 2 || holder(t, m, key("127.0.0.53", 53, plan.TCP)) != "a→192.0.2.2:80" || holder(t, m, key("127.0.0.1", 8092, plan.TCP)) != "a→192.0.2.2:80" {
		t.Fatalf("entries after ADD: %v, want 127.0.0.53:53 and 127.0.0.1:8092 alone", m.Entries)
	}
	if err := l.Check(p); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	rep, err := l.Sync([]*plan.Plan{p}, converge.Options{})
	if err != nil || rep.Wrote {
		t.Errorf("a pass beside ADD wrote: %+v %v", rep, err)
	}
}

func TestProgramNames(t *testing.T) {
	seen := map[string]bool{}
	for _, h := range Hooks {
		n := progName(h, Revision, Version())
		if len(n) > 15 || seen[n] {
			t.Errorf("program name %q: too long or twice", n)
		}
		seen[n] = true
		if r, ok := revisionOf(n); !ok || r != Revision {
			t.Errorf("the revision of %q: %d %v, want %d", n, r, ok, Revision)
		}
	}
	if len(Version()) != 8 {
		t.Errorf("version %q", Version())
	}
	for _, n := range []string{"pm_c4_1a2b3c4d", "pm_c4_x1_1a2b3c", "prog", "pm_c4_1_1a2b3c"} {
		if _, ok := revisionOf(n); ok {
			t.Errorf("revisionOf(%q) read a revision from a name progName does not make", n)
		}
	}
}

// revisions are the programs' Version at each Revision: a change to the
// programs that does not bump Revision fails here, since builds of one
// revision must run the same programs (or the older one would rewrite the
// newer's in a rolling update).
var revisions = map[int]string{1: "e298cc65"}

func TestProgramRevision(t *testing.T) {
	if got, want := Version(), revisions[Revision]; got != want {
		t.Errorf("the programs of revision %d are %s, recorded %s: a change to what they do bumps Revision (and records its version here)", Revision, got, want)
	}
}

// Retire removes the site only when no entry of any namespace or family
// remains, and a later ADD installs it again.
func TestRetire(t *testing.T) {
	m := NewMemory()
	l4, l6 := newLayer(plan.IPv4, m), newLayer(plan.IPv6, m)
	if what, err := l4.Retire(); err != nil || what != "" {
		t.Fatalf("retire of a site never installed: %q %v", what, err)
	}
	a, b := pl(plan.IPv4, "a", "192.0.2.2", tcp(1)), pl(plan.IPv6, "b", "2001:db8::2", tcp(2))
	for _, x := range []struct {
		l *Layer
		p *plan.Plan
	}{{l4, a}, {l6, b}} {
		if err := x.l.Apply(x.p); err != nil {
			t.Fatal(err)
		}
	}
	if err := l4.Remove(a); err != nil {
		t.Fatal(err)
	}
	if what, err := l4.Retire(); err != nil || what != "" || !m.Exists() {
		t.Fatalf("retired while the IPv6 entry remains: %q %v", what, err)
	}
	other := newLayer(plan.IPv4, m)
	other.Netns = func() (uint64, error) { return nodeNS + 1, nil }
	if err := other.Apply(a); err != nil {
		t.Fatal(err)
	}
	if err := l6.Remove(b); err != nil {
		t.Fatal(err)
	}
	if what, err := l6.Retire(); err != nil || what != "" || !m.Exists() {
		t.Fatalf("retired while another namespace's entry remains: %q %v", what, err)
	}
	if err := other.Remove(a); err != nil {
		t.Fatal(err)
	}
	what, err := l6.Retire()
	if err != nil || what == "" || m.Exists() {
		t.Fatalf("empty site not retired: %q %v (links %v)", what, err, m.Links)
	}
	if what, err := l4.Retire(); err != nil || what != "" {
		t.Errorf("second retire: %q %v", what, err)
	}
	if err := l4.Apply(a); err != nil || !m.Exists() || m.Installs["attach"] != 2*len(Hooks) {
		t.Errorf("ADD after retire: %v, installs %v", err, m.Installs)
	}
}

// A pass where no attachment takes the socket path and nothing of it is
// installed asks the kernel nothing: on a kernel before 5.14 (no netns
// cookie) it is not an error (before, every pass of the agent there
// failed).
func TestSyncWithoutTheSocketPathAsksNothing(t *testing.T) {
	l := newLayer(plan.IPv4, NewMemory())
	l.Netns = func() (uint64, error) {
		return 0, errors.New("netns cookie (SO_NETNS_COOKIE, Linux 5.14): protocol not available")
	}
	rep, err := l.Sync(nil, converge.Options{Prune: true})
	if err != nil || rep.Wrote {
		t.Errorf("Sync with nothing wanted or installed: %+v, %v; want nothing, no error", rep, err)
	}
}
