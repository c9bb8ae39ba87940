package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/userns"
)

// nla encodes one netlink attribute, padded to 4 bytes.
func nla(typ uint16, nested bool, payload []byte) []byte {
	b := make([]byte, 4, 4+len(payload)+3)
	binary.NativeEndian.PutUint16(b[0:2], uint16(4+len(payload)))
	if nested {
		typ |= nl.NLA_F_NESTED
	}
	binary.NativeEndian.PutUint16(b[2:4], typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// entry is a dump message as the kernel sends it: nfgenmsg, the original
// tuple (addresses, then protocol and ports), then more attributes.
func entry(family, proto uint8, dport uint16) []byte {
	return entryTo(family, proto, netip.Addr{}, dport)
}

// entryTo is entry with an original destination address (none where dst
// is the zero Addr).
func entryTo(family, proto uint8, dst netip.Addr, dport uint16) []byte {
	addrs := nla(nl.CTA_IP_V4_SRC, false, []byte{198, 51, 100, 2})
	if dst.Is4() {
		addrs = append(addrs, nla(nl.CTA_IP_V4_DST, false, dst.AsSlice())...)
	} else if dst.Is6() {
		addrs = append(addrs, nla(nl.CTA_IP_V6_DST, false, dst.AsSlice())...)
	}
	ip := nla(nl.CTA_TUPLE_IP, true, addrs)
	pr := nla(nl.CTA_TUPLE_PROTO, true, append(append(nla(nl.CTA_PROTO_NUM, false, []byte{proto}),
		nla(nl.CTA_PROTO_SRC_PORT, false, be16(40001))...), nla(nl.CTA_PROTO_DST_PORT, false, be16(dport))...))
	m := []byte{family, nl.NFNETLINK_V0, 0, 0}
	m = append(m, nla(nl.CTA_TUPLE_ORIG, true, append(ip, pr...))...)
	return append(m, nla(nl.CTA_TUPLE_REPLY, true, ip)...)
}

func TestOrigKey(t *testing.T) {
	for _, tt := range []struct {
		msg  []byte
		want key
		ok   bool
	}{
		{entry(unix.AF_INET, unix.IPPROTO_UDP, 6701), key{unix.AF_INET, unix.IPPROTO_UDP, 6701}, true},
		{entry(unix.AF_INET6, unix.IPPROTO_SCTP, 9000), key{unix.AF_INET6, unix.IPPROTO_SCTP, 9000}, true},
		{entry(unix.AF_INET, unix.IPPROTO_UDP, 6701)[:20], key{}, false}, // cut short
		{[]byte{2, 0}, key{}, false},
	} {
		got, _, ok := origTuple(tt.msg)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("origTuple = %+v, %v; want %+v, %v", got, ok, tt.want, tt.ok)
		}
	}
	if k := keyOf(Port{Family: plan.IPv6, Protocol: plan.UDP, Port: 53}); k != (key{unix.AF_INET6, unix.IPPROTO_UDP, 53}) {
		t.Errorf("keyOf: %+v", k)
	}
	for _, dst := range []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1"), {}} {
		fam := uint8(unix.AF_INET)
		if dst.Is6() {
			fam = unix.AF_INET6
		}
		if _, got, ok := origTuple(entryTo(fam, unix.IPPROTO_UDP, dst, 53)); !ok || got != dst {
			t.Errorf("origTuple's destination = %v, %v; want %v", got, ok, dst)
		}
	}
}

func TestCount(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		content string
		n       int
		known   bool
	}{{"0\n", 0, true}, {"3\n", 3, true}, {"", 0, false}, {"x", 0, false}} {
		p := filepath.Join(dir, "count")
		if err := os.WriteFile(p, []byte(tt.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if n, known := count(p); n != tt.n || known != tt.known {
			t.Errorf("count(%q) = %d, %v; want %d, %v", tt.content, n, known, tt.n, tt.known)
		}
	}
	if n, known := count(filepath.Join(dir, "absent")); n != 0 || !known {
		t.Errorf("no count file (conntrack not loaded): %d, %v; want 0, true", n, known)
	}
}

func TestProcMax(t *testing.T) {
	for rel, want := range map[string]int{
		"6.18.44-fc-v595": 4096, "6.15.0": 4096, "7.0.1": 4096,
		"6.14.11-300.fc42.x86_64": 256, "6.1.0-28-amd64": 256, "5.15.0-130-generic": 256, "": 256, "x": 256,
	} {
		if got := procMax(rel); got != want {
			t.Errorf("procMax(%q) = %d, want %d", rel, got, want)
		}
	}
}

// A procfs listing gives, for each entry with ports, the message a dump
// would: the original tuple (the first addresses and ports of the line,
// not the reply's) and a zone other than 0; entries without ports are
// left out, an entry zoned in one direction asks for a dump, a line the
// kernel would not write is an error.
func TestParseProc(t *testing.T) {
	const listing = `ipv4     2 udp      17 29 src=198.51.100.2 dst=192.0.2.1 sport=40001 dport=53 [UNREPLIED] src=192.0.2.1 dst=198.51.100.2 sport=53 dport=40001 mark=0 zone=0 use=2
ipv6     10 udp      17 25 src=2001:0db8:0000:0000:0000:0000:0000:0002 dst=2001:0db8:0000:0000:0000:0000:0000:0001 sport=40002 dport=6701 src=2001:0db8:0000:0000:0000:0000:0000:0001 dst=2001:0db8:0000:0000:0000:0000:0000:0002 sport=80 dport=40002 [ASSURED] mark=0 zone=0 use=2
ipv4     2 icmp     1 29 src=198.51.100.2 dst=192.0.2.1 type=8 code=0 id=7 src=192.0.2.1 dst=198.51.100.2 type=0 code=0 id=7 mark=0 zone=0 use=2
ipv4     2 tcp      6 431999 ESTABLISHED src=198.51.100.3 dst=192.0.2.1 sport=40003 dport=8080 src=10.0.0.2 dst=198.51.100.3 sport=80 dport=40003 [ASSURED] mark=0 zone=0 use=2
ipv4     2 sctp     132 3 COOKIE_WAIT src=198.51.100.4 dst=192.0.2.1 sport=5000 dport=9000 [UNREPLIED] src=192.0.2.1 dst=198.51.100.4 sport=9000 dport=5000 mark=0 zone=7 use=2
`
	msgs, err := parseProc(listing)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		zone, _ := nfnl.Find(m[4:], ctaZone)
		orig, _ := nfnl.Find(m[4:], ctaTupleOrig)
		ip, _ := nfnl.Find(orig, ctaTupleIP)
		var addrs []string
		for _, a := range nfnl.Parse(ip) {
			addr, _ := netip.AddrFromSlice(a.Value)
			addrs = append(addrs, fmt.Sprintf("%d:%s", a.Type, addr))
		}
		from, _ := replySource(m)
		got = append(got, fmt.Sprintf("%s %v from %s zone%x", entryKey(t, m), addrs, from, zone))
	}
	want := []string{
		"2/17/53 [1:198.51.100.2 2:192.0.2.1] from 192.0.2.1:53 zone",
		"10/17/6701 [3:2001:db8::2 4:2001:db8::1] from [2001:db8::1]:80 zone",
		"2/6/8080 [1:198.51.100.3 2:192.0.2.1] from 10.0.0.2:80 zone",
		"2/132/9000 [1:198.51.100.4 2:192.0.2.1] from 192.0.2.1:9000 zone0007",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("parseProc:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	zoned := "ipv4     2 udp      17 29 src=198.51.100.2 dst=192.0.2.1 sport=40001 dport=53 zone-orig=3 [UNREPLIED] src=192.0.2.1 dst=198.51.100.2 sport=53 dport=40001 mark=0 use=2\n"
	if _, err := parseProc(zoned); !errors.Is(err, errDirZone) {
		t.Errorf("an entry zoned in one direction: %v, want errDirZone", err)
	}
	for _, bad := range []string{
		"ipv4     2 udp      17 29 src=198.51.100.2 dst=192.0.2.1 sport=40001 dport=70000 use=2\n",
		"ipv4     2 udp      17 29 src=198.51.100 dst=192.0.2.1 sport=40001 dport=53 use=2\n",
		"ipv4     2 udp      x 29 src=198.51.100.2 dst=192.0.2.1 sport=40001 dport=53 use=2\n",
	} {
		if _, err := parseProc(bad); err == nil {
			t.Errorf("parseProc(%q) took a line the kernel does not write", bad)
		}
	}
}

// memTable is a conntrack table in memory.
type memTable struct {
	msgs    [][]byte
	dumpErr error
	fail    map[uint16]error // deletion of an entry of this port fails
	removed []string
	// locals are the node's addresses (nil: every address is);
	// asked counts the questions
	locals map[netip.Addr]bool
	asked  int
	// onRemove, when set, sees each message removed
	onRemove func(msg []byte)
}

func (m *memTable) dump() ([][]byte, error) { return m.msgs, m.dumpErr }
func (m *memTable) remove(family uint8, msg []byte) error {
	k, dst, _ := origTuple(msg)
	if err := m.fail[k.port]; err != nil {
		return err
	}
	r := fmt.Sprintf("%d/%d/%d", family, k.proto, k.port)
	if dst.IsValid() {
		r = fmt.Sprintf("%d/%d/%s", family, k.proto, netip.AddrPortFrom(dst, k.port))
	}
	m.removed = append(m.removed, r)
	if m.onRemove != nil {
		m.onRemove(msg)
	}
	return nil
}
func (m *memTable) local(a netip.Addr) bool {
	m.asked++
	return m.locals == nil || m.locals[a]
}

// One dump, then a deletion for each entry of a flushed family,
// protocol and port, in its own family; a deletion of an entry that went
// meanwhile is no failure, other failures are counted.
func TestFlush(t *testing.T) {
	tbl := func() *memTable {
		return &memTable{msgs: [][]byte{
			entry(unix.AF_INET, unix.IPPROTO_UDP, 53),
			entry(unix.AF_INET6, unix.IPPROTO_UDP, 53),
			entry(unix.AF_INET, unix.IPPROTO_TCP, 53),
			entry(unix.AF_INET, unix.IPPROTO_SCTP, 9000),
			entry(unix.AF_INET, unix.IPPROTO_UDP, 54),
			{2, 0},
		}}
	}
	ports := []Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 53}, {Family: plan.IPv4, Protocol: plan.SCTP, Port: 9000}}
	m := tbl()
	if err := flush(m, ports); err != nil || strings.Join(m.removed, " ") != "2/17/53 2/132/9000" {
		t.Errorf("flush: %v, removed %q", err, m.removed)
	}
	m = tbl()
	m.fail = map[uint16]error{53: unix.ENOENT}
	if err := flush(m, ports); err != nil || strings.Join(m.removed, " ") != "2/132/9000" {
		t.Errorf("flush with an entry gone: %v, removed %q", err, m.removed)
	}
	m = tbl()
	m.fail = map[uint16]error{53: unix.EPERM, 9000: unix.EPERM}
	if err := flush(m, ports); err == nil || !strings.Contains(err.Error(), "2 deletions failed") || !errors.Is(err, unix.EPERM) {
		t.Errorf("flush with failing deletions: %v", err)
	}
	m = tbl()
	m.dumpErr = unix.EPERM
	if err := flush(m, ports); !errors.Is(err, unix.EPERM) || len(m.removed) != 0 {
		t.Errorf("flush with a failing dump: %v, removed %q", err, m.removed)
	}
	if !NeedsFlush(plan.UDP) || !NeedsFlush(plan.SCTP) || NeedsFlush(plan.TCP) {
		t.Error("NeedsFlush: UDP and SCTP, not TCP")
	}
	if err := (Host{}).FlushDstPorts(nil); err != nil {
		t.Errorf("no ports: %v", err)
	}
}

// A flush deletes a host port's flows only where their original
// destination is an address of the node, and the port's own hostIP where
// it names one: the node's and its pods' flows to other hosts on the
// same port number are kept, and so are flows to a hostIP that is not
// the node's (a pod spec naming another host's address). The node is
// asked once per destination, and only about entries of a flushed port.
func TestFlushOnlyTheNodesAddresses(t *testing.T) {
	a := netip.MustParseAddr
	node, node2, lo := a("192.0.2.1"), a("192.0.2.2"), a("127.0.0.1")
	remote, node6, remote6 := a("203.0.113.9"), a("2001:db8::1"), a("2001:db8:ff::9")
	udp4 := func(dst netip.Addr, port uint16) []byte { return entryTo(unix.AF_INET, unix.IPPROTO_UDP, dst, port) }
	udp6 := func(dst netip.Addr, port uint16) []byte { return entryTo(unix.AF_INET6, unix.IPPROTO_UDP, dst, port) }
	msgs := [][]byte{
		udp4(node, 4433), udp4(node2, 4433), udp4(lo, 4433), udp4(remote, 4433),
		udp4(remote, 4433), udp4(remote, 53), udp4(node, 53),
		udp6(node6, 4433), udp6(remote6, 4433),
		udp4(netip.Addr{}, 4433), // no destination read: not judged the node's
	}
	locals := map[netip.Addr]bool{node: true, node2: true, lo: true, node6: true}
	for _, tt := range []struct {
		name  string
		ports []Port
		want  string
		asked int
	}{
		{"wildcard", []Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 4433}, {Family: plan.IPv6, Protocol: plan.UDP, Port: 4433}},
			"2/17/192.0.2.1:4433 2/17/192.0.2.2:4433 2/17/127.0.0.1:4433 10/17/[2001:db8::1]:4433", 7},
		{"hostIP of the node", []Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 4433, Addr: node2}}, "2/17/192.0.2.2:4433", 1},
		{"hostIP of another host", []Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 4433, Addr: remote}}, "", 1},
		{"hostIP of another host, v6", []Port{{Family: plan.IPv6, Protocol: plan.UDP, Port: 4433, Addr: remote6}}, "", 1},
		{"a wildcard and a hostIP of the same port", []Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 53, Addr: node2}, {Family: plan.IPv4, Protocol: plan.UDP, Port: 53}},
			"2/17/192.0.2.1:53", 2},
		{"a port no entry has", []Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 9}}, "", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &memTable{msgs: msgs, locals: locals}
			if err := flush(m, tt.ports); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(m.removed, " "); got != tt.want {
				t.Errorf("removed %q, want %q", got, tt.want)
			}
			if m.asked != tt.asked {
				t.Errorf("asked the node about %d addresses, want %d", m.asked, tt.asked)
			}
		})
	}
}

// entryFrom is entryTo of UDP to dst:dport whose replies come from from
// (a DNATed flow's: the container's address and port).
func entryFrom(dst netip.Addr, dport uint16, from netip.AddrPort) []byte {
	m := entryTo(unix.AF_INET, unix.IPPROTO_UDP, dst, dport)
	// the reply tuple entryTo wrote holds no ports: replace it
	orig, _ := nfnl.Find(m[4:], ctaTupleOrig)
	m = append(m[:4:4], nla(nl.CTA_TUPLE_ORIG, true, orig)...)
	ip := nla(nl.CTA_TUPLE_IP, true, append(nla(nl.CTA_IP_V4_SRC, false, from.Addr().AsSlice()), nla(nl.CTA_IP_V4_DST, false, []byte{198, 51, 100, 2})...))
	pr := nla(nl.CTA_TUPLE_PROTO, true, append(append(nla(nl.CTA_PROTO_NUM, false, []byte{unix.IPPROTO_UDP}),
		nla(nl.CTA_PROTO_SRC_PORT, false, be16(from.Port()))...), nla(nl.CTA_PROTO_DST_PORT, false, be16(40001))...))
	return append(m, nla(nl.CTA_TUPLE_REPLY, true, append(ip, pr...))...)
}

// A flush deletes only the flows the rules now translate otherwise. For a
// port mapped (ADD, a repair): those whose reply does not come from the
// container's address and port (a flow that met no DNAT while the rules
// were missing, one to a container that had the port before); the
// flows translated right stay. For a port whose rules went (DEL): those
// whose reply comes from the deleted container, not a newer one's nor one
// that met no DNAT; a DEL that does not know where the port went flushes
// every flow of it, as upstream's does. An entry whose reply cannot be
// read is wrong for a mapped port.
func TestFlushOnlyWrongFlows(t *testing.T) {
	a, ap := netip.MustParseAddr, netip.MustParseAddrPort
	node := a("192.0.2.1")
	now, before := ap("10.0.0.2:53"), ap("10.0.0.3:53")
	msgs := [][]byte{
		entryFrom(node, 5353, now),                          // translated right
		entryFrom(node, 5353, before),                       // to the container before
		entryFrom(node, 5353, ap("192.0.2.1:5353")),         // met no DNAT
		entryTo(unix.AF_INET, unix.IPPROTO_UDP, node, 5353), // no reply read
	}
	port := func(to netip.AddrPort, gone bool) Port {
		return Port{Family: plan.IPv4, Protocol: plan.UDP, Port: 5353, To: to, Gone: gone}
	}
	for _, tt := range []struct {
		name  string
		ports []Port
		want  string // the flows flushed, by where their reply comes from
	}{
		{"ADD, a repair", []Port{port(now, false)}, "10.0.0.3:53 192.0.2.1:5353 ?"},
		{"ADD of the container before", []Port{port(before, false)}, "10.0.0.2:53 192.0.2.1:5353 ?"},
		{"where the port goes not said", []Port{port(netip.AddrPort{}, false)}, "10.0.0.2:53 10.0.0.3:53 192.0.2.1:5353 ?"},
		{"DEL", []Port{port(now, true)}, "10.0.0.2:53"},
		{"DEL of the container before, the port a newer one's", []Port{port(before, true)}, "10.0.0.3:53"},
		{"DEL without prevResult", []Port{port(netip.AddrPort{}, true)}, "10.0.0.2:53 10.0.0.3:53 192.0.2.1:5353 ?"},
		{"a hostIP's port beside the wildcard's", []Port{port(before, false), {Family: plan.IPv4, Protocol: plan.UDP, Port: 5353, Addr: node, To: now}},
			"10.0.0.3:53 192.0.2.1:5353 ?"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &memTable{msgs: msgs}
			var flushed []string
			m.onRemove = func(msg []byte) {
				if from, ok := replySource(msg); ok {
					flushed = append(flushed, from.String())
				} else {
					flushed = append(flushed, "?")
				}
			}
			if err := flush(m, tt.ports); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(flushed, " "); got != tt.want {
				t.Errorf("flushed the flows from %q, want %q", got, tt.want)
			}
		})
	}
}

// openKernelTable is the table of the test's own namespace (userns.Main).
func openKernelTable(t *testing.T) kernelTable {
	t.Helper()
	userns.Require(t)
	c, err := nfnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return kernelTable{c}
}

// The kernel's table of a namespace of the test's own: one dump, and the
// deletion of an entry it does not hold answers ENOENT, which a flush
// takes for "gone meanwhile".
func TestKernelTable(t *testing.T) {
	kt := openKernelTable(t)
	msgs, err := kt.dump()
	if err != nil || len(msgs) != 0 {
		t.Fatalf("dump of a new namespace's table: %d entries, %v", len(msgs), err)
	}
	ip := nla(nl.CTA_TUPLE_IP, true, append(nla(nl.CTA_IP_V4_SRC, false, []byte{198, 51, 100, 2}), nla(nl.CTA_IP_V4_DST, false, []byte{192, 0, 2, 1})...))
	pr := nla(nl.CTA_TUPLE_PROTO, true, append(append(nla(nl.CTA_PROTO_NUM, false, []byte{unix.IPPROTO_UDP}),
		nla(nl.CTA_PROTO_SRC_PORT, false, be16(40001))...), nla(nl.CTA_PROTO_DST_PORT, false, be16(53))...))
	msg := append([]byte{unix.AF_INET, nl.NFNETLINK_V0, 0, 0}, nla(nl.CTA_TUPLE_ORIG, true, append(ip, pr...))...)
	if err := kt.remove(unix.AF_INET, msg); !errors.Is(err, unix.ENOENT) {
		t.Errorf("remove of an entry the table lacks: %v, want ENOENT", err)
	}
	if err := flush(kt, []Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 53}}); err != nil {
		t.Errorf("flush of an empty table: %v", err)
	}
}

// udpEntry puts a UDP entry into the namespace's table, as a flow from
// src:sport to dst:dport would.
func udpEntry(t *testing.T, src, dst string, sport, dport uint16) {
	t.Helper()
	s, d := net.ParseIP(src), net.ParseIP(dst)
	fam := uint8(unix.AF_INET)
	if s.To4() == nil {
		fam = unix.AF_INET6
	} else {
		s, d = s.To4(), d.To4() // the library writes an address's first 4 bytes
	}
	flow := &netlink.ConntrackFlow{
		FamilyType: fam,
		Forward:    netlink.IPTuple{SrcIP: s, DstIP: d, Protocol: unix.IPPROTO_UDP, SrcPort: sport, DstPort: dport},
		Reverse:    netlink.IPTuple{SrcIP: d, DstIP: s, Protocol: unix.IPPROTO_UDP, SrcPort: dport, DstPort: sport},
		TimeOut:    300,
	}
	if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(fam), flow); err != nil {
		t.Fatalf("create conntrack entry %s:%d → %s:%d: %v", src, sport, dst, dport, err)
	}
}

// natEntry makes an IPv4 UDP entry src:sport → dst:dport whose replies
// come from to:toPort, as a DNATed flow's do.
func natEntry(t *testing.T, src, dst string, sport, dport uint16, to string, toPort uint16) {
	t.Helper()
	s, d, c := net.ParseIP(src).To4(), net.ParseIP(dst).To4(), net.ParseIP(to).To4()
	flow := &netlink.ConntrackFlow{
		FamilyType: unix.AF_INET,
		Forward:    netlink.IPTuple{SrcIP: s, DstIP: d, Protocol: unix.IPPROTO_UDP, SrcPort: sport, DstPort: dport},
		Reverse:    netlink.IPTuple{SrcIP: c, DstIP: s, Protocol: unix.IPPROTO_UDP, SrcPort: toPort, DstPort: sport},
		TimeOut:    300,
	}
	if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(unix.AF_INET), flow); err != nil {
		t.Fatalf("create conntrack entry %s:%d → %s:%d (replies from %s:%d): %v", src, sport, dst, dport, to, toPort, err)
	}
}

// froms lists where the replies of a table's entries come from, sorted.
func froms(t *testing.T, tb table) []string {
	t.Helper()
	return listed(t, tb, func(m []byte) string {
		from, _ := replySource(m)
		return from.String()
	})
}

// On the real kernel: a flush of a mapped port through the procfs
// listing keeps the flow translated to the container and deletes the one
// to the container before and the one that met no DNAT; a flush of a
// port whose rules went (DEL) through the dump deletes the deleted
// container's flow alone.
func TestKernelFlushesWrongFlowsOnly(t *testing.T) {
	kt := openKernelTable(t)
	nodeAddrs(t)
	t.Cleanup(func() { _ = netlink.ConntrackTableFlush(netlink.ConntrackTable) })
	natEntry(t, "198.51.100.2", "192.0.2.1", 40001, 5353, "10.0.0.2", 53)
	natEntry(t, "198.51.100.3", "192.0.2.1", 40002, 5353, "10.0.0.3", 53)
	udpEntry(t, "198.51.100.4", "192.0.2.1", 40003, 5353)
	if got := froms(t, procTable{kt, procPath}); !slices.Equal(got, []string{"10.0.0.2:53", "10.0.0.3:53", "192.0.2.1:5353"}) {
		t.Fatalf("the listing's replies: %v", got)
	}
	mapped := Port{Family: plan.IPv4, Protocol: plan.UDP, Port: 5353, To: netip.MustParseAddrPort("10.0.0.2:53")}
	if err := flush(procTable{kt, procPath}, []Port{mapped}); err != nil {
		t.Fatal(err)
	}
	if got := froms(t, kt); !slices.Equal(got, []string{"10.0.0.2:53"}) {
		t.Errorf("after a flush of the port mapped to 10.0.0.2:53: the flows from %v, want the one from it alone", got)
	}
	natEntry(t, "198.51.100.3", "192.0.2.1", 40002, 5353, "10.0.0.3", 53)
	udpEntry(t, "198.51.100.4", "192.0.2.1", 40003, 5353)
	gone := mapped
	gone.Gone = true
	if err := flush(kt, []Port{gone}); err != nil {
		t.Fatal(err)
	}
	if got := froms(t, kt); !slices.Equal(got, []string{"10.0.0.3:53", "192.0.2.1:5353"}) {
		t.Errorf("after a flush of the port whose rules to 10.0.0.2:53 went: the flows from %v, want the others", got)
	}
}

// keys lists what a table's dump holds, sorted.
func keys(t *testing.T, tb table) []string {
	t.Helper()
	return listed(t, tb, func(m []byte) string { return entryKey(t, m) })
}

// listed is each entry of a table's dump as show spells it, sorted.
func listed(t *testing.T, tb table, show func([]byte) string) []string {
	t.Helper()
	msgs, err := tb.dump()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range msgs {
		out = append(out, show(m))
	}
	slices.Sort(out)
	return out
}

// entryKey is an entry's family, protocol and original destination port.
func entryKey(t *testing.T, m []byte) string {
	t.Helper()
	k, _, ok := origTuple(m)
	if !ok {
		t.Fatalf("an entry without its original tuple: %x", m)
	}
	return fmt.Sprintf("%d/%d/%d", k.family, k.proto, k.port)
}

// nodeAddrs makes 192.0.2.1 and 2001:db8::1 addresses of the test's own
// namespace (on its loopback, brought up), and routes 203.0.113.0/24 and
// 2001:db8:ff::/48 out of it, as a node has its addresses and reaches
// other hosts.
func nodeAddrs(t *testing.T) {
	t.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"192.0.2.1/32", "2001:db8::1/128"} {
		addr, _ := netlink.ParseAddr(a)
		if err := netlink.AddrAdd(lo, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatalf("address %s: %v", a, err)
		}
	}
	for _, d := range []string{"203.0.113.0/24", "2001:db8:ff::/48"} {
		_, dst, _ := net.ParseCIDR(d)
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst}); err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatalf("route %s: %v", d, err)
		}
	}
}

// On the real kernel, in a namespace of the test's own: the procfs
// listing holds what the ctnetlink dump holds; a flush through it deletes
// the entries of the flushed ports (each by the message built from its
// line) whose destination is the node's, and keeps the others (the
// node's flows to other hosts on the same port among them); a listing
// that is not there is dumped.
func TestProcTable(t *testing.T) {
	kt := openKernelTable(t)
	nodeAddrs(t)
	pt := procTable{kt, procPath}
	udpEntry(t, "198.51.100.2", "192.0.2.1", 40001, 53)
	udpEntry(t, "198.51.100.2", "192.0.2.1", 40001, 54)
	udpEntry(t, "198.51.100.3", "192.0.2.1", 40002, 53)
	udpEntry(t, "192.0.2.1", "203.0.113.9", 40003, 53) // the node's own, to another host
	udpEntry(t, "2001:db8::2", "2001:db8::1", 40001, 53)
	udpEntry(t, "2001:db8::2", "2001:db8::1", 40001, 6701)
	udpEntry(t, "2001:db8::1", "2001:db8:ff::9", 40003, 6701) // the same, IPv6
	all := []string{"10/17/53", "10/17/6701", "10/17/6701", "2/17/53", "2/17/53", "2/17/53", "2/17/54"}
	if got := keys(t, kt); !slices.Equal(got, all) {
		t.Fatalf("dump: %v, want %v", got, all)
	}
	if got := keys(t, pt); !slices.Equal(got, all) {
		t.Fatalf("procfs listing: %v, want what the dump holds, %v", got, all)
	}
	if n, known := count(countPath); n != len(all) || !known {
		t.Errorf("count: %d, %v; want %d", n, known, len(all))
	}
	if !kt.local(netip.MustParseAddr("192.0.2.1")) || !kt.local(netip.MustParseAddr("127.0.0.1")) || !kt.local(netip.MustParseAddr("2001:db8::1")) ||
		kt.local(netip.MustParseAddr("203.0.113.9")) || kt.local(netip.MustParseAddr("198.51.100.9")) || kt.local(netip.Addr{}) {
		t.Error("local: the namespace's addresses and 127.0.0.1 are local, a routed, an unroutable and no address are not")
	}
	if err := flush(pt, []Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 53}, {Family: plan.IPv6, Protocol: plan.UDP, Port: 6701}}); err != nil {
		t.Fatal(err)
	}
	left := []string{"10/17/53", "10/17/6701", "2/17/53", "2/17/54"}
	if got := keys(t, kt); !slices.Equal(got, left) {
		t.Errorf("after a flush of 4/udp/53 and 6/udp/6701 through the listing: %v, want %v (the flows to other hosts kept)", got, left)
	}
	if got := dsts(t, kt); !slices.Equal(got, []string{"192.0.2.1:54", "203.0.113.9:53", "[2001:db8::1]:53", "[2001:db8:ff::9]:6701"}) {
		t.Errorf("left: %v", got)
	}
	absent := procTable{kt, filepath.Join(t.TempDir(), "nf_conntrack")}
	if got := keys(t, absent); !slices.Equal(got, left) {
		t.Errorf("without a listing: %v, want the dump's %v", got, left)
	}
	garbled := filepath.Join(t.TempDir(), "nf_conntrack")
	if err := os.WriteFile(garbled, []byte("ipv4     2 udp      x 29 src=198.51.100.2 dst=192.0.2.1 sport=1 dport=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := keys(t, procTable{kt, garbled}); !slices.Equal(got, left) {
		t.Errorf("with a line it cannot read: %v, want the dump's %v", got, left)
	}
	// a hostIP that is not the node's flushes nothing, not even its own flow
	if err := (Host{}).FlushDstPorts([]Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 53, Addr: netip.MustParseAddr("203.0.113.9")}}); err != nil {
		t.Fatal(err)
	}
	if got := keys(t, kt); !slices.Equal(got, left) {
		t.Errorf("after a flush of a hostIP of another host: %v, want %v", got, left)
	}
	if err := (Host{}).FlushDstPorts([]Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 54}, {Family: plan.IPv6, Protocol: plan.UDP, Port: 53}}); err != nil {
		t.Fatal(err)
	}
	if got := dsts(t, kt); !slices.Equal(got, []string{"203.0.113.9:53", "[2001:db8:ff::9]:6701"}) {
		t.Errorf("after FlushDstPorts of the rest: %v, want the flows to other hosts alone", got)
	}
}

// dsts lists the original destinations of a table's entries, sorted.
func dsts(t *testing.T, tb table) []string {
	t.Helper()
	return listed(t, tb, func(m []byte) string {
		k, dst, _ := origTuple(m)
		return netip.AddrPortFrom(dst, k.port).String()
	})
}

func TestMain(m *testing.M) { userns.Main(m) }
