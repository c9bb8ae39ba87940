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
	ip := nla(nl.CTA_TUPLE_IP, true, nla(nl.CTA_IP_V4_SRC, false, []byte{198, 51, 100, 2}))
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
		got, ok := origKey(tt.msg)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("origKey = %+v, %v; want %+v, %v", got, ok, tt.want, tt.ok)
		}
	}
	if k := keyOf(Port{Family: plan.IPv6, Protocol: plan.UDP, Port: 53}); k != (key{unix.AF_INET6, unix.IPPROTO_UDP, 53}) {
		t.Errorf("keyOf: %+v", k)
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
		got = append(got, fmt.Sprintf("%s %v zone%x", entryKey(t, m), addrs, zone))
	}
	want := []string{
		"2/17/53 [1:198.51.100.2 2:192.0.2.1] zone",
		"10/17/6701 [3:2001:db8::2 4:2001:db8::1] zone",
		"2/6/8080 [1:198.51.100.3 2:192.0.2.1] zone",
		"2/132/9000 [1:198.51.100.4 2:192.0.2.1] zone0007",
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
}

func (m *memTable) dump() ([][]byte, error) { return m.msgs, m.dumpErr }
func (m *memTable) remove(family uint8, msg []byte) error {
	k, _ := origKey(msg)
	if err := m.fail[k.port]; err != nil {
		return err
	}
	m.removed = append(m.removed, fmt.Sprintf("%d/%d/%d", family, k.proto, k.port))
	return nil
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
	ports := []Port{{plan.IPv4, plan.UDP, 53}, {plan.IPv4, plan.SCTP, 9000}}
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
	if err := flush(kt, []Port{{plan.IPv4, plan.UDP, 53}}); err != nil {
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

// keys lists what a table's dump holds, sorted.
func keys(t *testing.T, tb table) []string {
	t.Helper()
	msgs, err := tb.dump()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range msgs {
		out = append(out, entryKey(t, m))
	}
	slices.Sort(out)
	return out
}

// entryKey is an entry's family, protocol and original destination port.
func entryKey(t *testing.T, m []byte) string {
	t.Helper()
	k, ok := origKey(m)
	if !ok {
		t.Fatalf("an entry without its original tuple: %x", m)
	}
	return fmt.Sprintf("%d/%d/%d", k.family, k.proto, k.port)
}

// On the real kernel, in a namespace of the test's own: the procfs
// listing holds what the ctnetlink dump holds; a flush through it deletes
// the entries of the flushed ports (each by the message built from its
// line) and keeps the others; a listing that is not there is dumped.
func TestProcTable(t *testing.T) {
	kt := openKernelTable(t)
	pt := procTable{kt, procPath}
	udpEntry(t, "198.51.100.2", "192.0.2.1", 40001, 53)
	udpEntry(t, "198.51.100.2", "192.0.2.1", 40001, 54)
	udpEntry(t, "198.51.100.3", "192.0.2.1", 40002, 53)
	udpEntry(t, "2001:db8::2", "2001:db8::1", 40001, 53)
	udpEntry(t, "2001:db8::2", "2001:db8::1", 40001, 6701)
	all := []string{"10/17/53", "10/17/6701", "2/17/53", "2/17/53", "2/17/54"}
	if got := keys(t, kt); !slices.Equal(got, all) {
		t.Fatalf("dump: %v, want %v", got, all)
	}
	if got := keys(t, pt); !slices.Equal(got, all) {
		t.Fatalf("procfs listing: %v, want what the dump holds, %v", got, all)
	}
	if n, known := count(countPath); n != len(all) || !known {
		t.Errorf("count: %d, %v; want %d", n, known, len(all))
	}
	if err := flush(pt, []Port{{plan.IPv4, plan.UDP, 53}, {plan.IPv6, plan.UDP, 6701}}); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(t, kt), []string{"10/17/53", "2/17/54"}; !slices.Equal(got, want) {
		t.Errorf("after a flush of 4/udp/53 and 6/udp/6701 through the listing: %v, want %v", got, want)
	}
	absent := procTable{kt, filepath.Join(t.TempDir(), "nf_conntrack")}
	if got, want := keys(t, absent), []string{"10/17/53", "2/17/54"}; !slices.Equal(got, want) {
		t.Errorf("without a listing: %v, want the dump's %v", got, want)
	}
	garbled := filepath.Join(t.TempDir(), "nf_conntrack")
	if err := os.WriteFile(garbled, []byte("ipv4     2 udp      x 29 src=198.51.100.2 dst=192.0.2.1 sport=1 dport=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(t, procTable{kt, garbled}), []string{"10/17/53", "2/17/54"}; !slices.Equal(got, want) {
		t.Errorf("with a line it cannot read: %v, want the dump's %v", got, want)
	}
	if err := (Host{}).FlushDstPorts([]Port{{plan.IPv4, plan.UDP, 54}, {plan.IPv6, plan.UDP, 53}}); err != nil {
		t.Fatal(err)
	}
	if got := keys(t, kt); len(got) != 0 {
		t.Errorf("after FlushDstPorts of the rest: %v left", got)
	}
}

func TestMain(m *testing.M) { userns.Main(m) }
