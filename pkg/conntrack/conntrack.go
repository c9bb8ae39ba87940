// Package conntrack removes stale conntrack entries for host ports. A UDP or
// SCTP flow that started before the port was mapped keeps its old
// translation (often none) for as long as packets keep coming, so ADD, DEL
// and a repairing sync flush the entries whose original destination is a
// host port — its port, at an address of the node (the mapping's hostIP
// where it names one) — and whose translation is not the rules' now: their
// reply does not come from the container the port goes to (ADD, a repair),
// or comes from the one whose rules went (DEL). Flows translated right are
// kept: a live flow from the pod across a firewall flush and its repair, a
// newer attachment's flows across an older one's DEL. The node's and its
// pods' flows to other hosts on the same port number are not the host
// port's, and are kept: an address is the node's when the kernel's route
// to it is of type local, which is what the DNAT rules' "fib daddr type
// local" and "--dst-type LOCAL" ask, looked up once per destination among
// the entries of a flushed port.
//
// Finding them means reading the namespace's table, and the kernel's hash
// is shared by every namespace (262144 buckets on a small machine). Over
// ctnetlink a dump takes a bucket lock for each bucket: 12 ms here
// whatever it finds. /proc/net/nf_conntrack walks the same hash under RCU
// only: 0.4 ms for a namespace of one entry, 2.4 ms for a thousand. But
// kernels before 6.15 start each 4 KiB read of it from the first bucket
// again, so the listing is read only for a namespace of at most procMax
// entries (a dozen reads there, a few thousand from 6.15), and a bigger
// one is dumped; either way one read of both families for every port at
// once, and only the matching entries are deleted, each in its own
// family. A namespace whose conntrack table is empty (nf_conntrack_count,
// which is per namespace, reads 0, or conntrack is not loaded) has
// nothing stale, and nothing is read.
package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/netns"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Host is the real kernel's conntrack table, reached through netlink.
type Host struct{}

// NeedsFlush reports whether flows of proto outlive a rule change and need
// a flush: connectionless UDP, and SCTP. TCP flows end on their own.
func NeedsFlush(proto plan.Protocol) bool {
	return proto == plan.UDP || proto == plan.SCTP
}

// Port is a host port of one family and protocol, and where the rules
// send it.
type Port struct {
	Family   plan.Family
	Protocol plan.Protocol
	Port     int
	// Addr is the mapping's hostIP; the zero Addr is every address of
	// the node. An Addr that is not the node's flushes nothing.
	Addr netip.Addr
	// To is the container's address and port the rules send the host
	// port to. A flow whose reply comes from there is translated right
	// and kept (a live UDP flow, an SCTP association across a firewall
	// flush and its repair); every other is wrong and flushed: one that
	// met no DNAT, one to a container that had the port before. The zero
	// To: every flow of the port is flushed.
	To netip.AddrPort
	// Gone says the rules that sent the port To are gone (DEL): the flows
	// whose reply comes from To are wrong and flushed, every other is
	// kept (one to a newer attachment that has the port, one that met no
	// DNAT). Gone with the zero To (a DEL that does not know the
	// container's address): every flow of the port, as upstream flushes.
	Gone bool
}

// key is what a conntrack entry is matched on: its family, and the
// protocol and destination port of its original direction.
type key struct {
	family uint8
	proto  uint8
	port   uint16
}

func keyOf(p Port) key {
	k := key{family: unix.AF_INET, proto: unix.IPPROTO_UDP, port: uint16(p.Port)}
	if p.Family == plan.IPv6 {
		k.family = unix.AF_INET6
	}
	if p.Protocol == plan.SCTP {
		k.proto = unix.IPPROTO_SCTP
	}
	return k
}

// FlushDstPorts deletes the entries whose family, protocol and original
// destination port are one of ports, with one read of the table.
func (Host) FlushDstPorts(ports []Port) error {
	if len(ports) == 0 {
		return nil
	}
	n, known := count(countPath)
	if known && n == 0 {
		return nil
	}
	c, err := nfnl.Open()
	if err != nil {
		return fmt.Errorf("flush conntrack entries: %w", err)
	}
	defer c.Close()
	var t table = kernelTable{c}
	if known && n <= procMax(nfnl.Release()) {
		t = procTable{kernelTable{c}, procPath}
	}
	return flush(t, ports)
}

// table is a conntrack table: one dump of every entry (messages as the
// kernel sends them: nfgenmsg, then attributes), one deletion, and the
// node's answer to whether an address is its own.
type table interface {
	dump() ([][]byte, error)
	remove(family uint8, msg []byte) error
	local(addr netip.Addr) bool
}

// flush deletes the entries of t that ports name and find wrong, after
// one dump: those of a port's family, protocol and port whose original
// destination is an address of the node, and the port's own address
// where it names one, and whose reply does not come from where the port
// is sent (Port.To, Port.Gone). An entry gone meanwhile is no failure.
func flush(t table, ports []Port) error {
	// per key, the ports of it
	want := map[key][]Port{}
	for _, p := range ports {
		p.Addr = p.Addr.Unmap()
		want[keyOf(p)] = append(want[keyOf(p)], p)
	}
	msgs, err := t.dump()
	if err != nil {
		return fmt.Errorf("dump conntrack entries: %w", err)
	}
	locals := map[netip.Addr]bool{}
	isLocal := func(a netip.Addr) bool {
		l, seen := locals[a]
		if !seen {
			l = t.local(a)
			locals[a] = l
		}
		return l
	}
	var errs []error
	for _, m := range msgs {
		k, dst, ok := origTuple(m)
		if !ok {
			continue
		}
		ps := named(want[k], dst)
		if len(ps) == 0 || !isLocal(dst) || !wrong(ps, m) {
			continue
		}
		if err := t.remove(k.family, m); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("flush conntrack entries of %d host ports: %d deletions failed: %w", len(ports), len(errs), errs[0])
	}
	return nil
}

// named returns the ports of ps that name dst, as the rules match it: a
// port of that hostIP where there is one, else those of every address of
// the node.
func named(ps []Port, dst netip.Addr) []Port {
	var exact, any []Port
	for _, p := range ps {
		switch {
		case p.Addr == dst && dst.IsValid():
			exact = append(exact, p)
		case !p.Addr.IsValid():
			any = append(any, p)
		}
	}
	if len(exact) > 0 {
		return exact
	}
	return any
}

// wrong reports whether the entry m, of a port of ps, is translated
// otherwise than the rules now say: its reply comes from a place no port
// of ps sends it, or from where a port whose rules are gone sent it. A
// port whose rules are gone without saying where they sent it (DEL
// without prevResult) finds every flow of it wrong, as upstream's DEL
// does; so does a mapped port for an entry whose reply cannot be read.
func wrong(ps []Port, m []byte) bool {
	from, known := replySource(m)
	del := false
	for _, p := range ps {
		switch {
		case p.Gone && !p.To.IsValid():
			del = true
		case p.Gone:
			del = del || (known && from == p.To)
		case known && from == p.To:
			return false // translated right
		default:
			del = true
		}
	}
	return del
}

// ctnetlink's messages and attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctGet         = unix.NFNL_SUBSYS_CTNETLINK<<8 | 1 // IPCTNL_MSG_CT_GET
	ctDelete      = unix.NFNL_SUBSYS_CTNETLINK<<8 | 2 // IPCTNL_MSG_CT_DELETE
	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaTupleProto = 2
	ctaProtoNum   = 1
	ctaProtoDport = 3
	ctaTupleIP    = 1
	ctaIPv4Dst    = 2
	ctaIPv6Dst    = 4
)

// kernelTable is the table of the calling thread's namespace, through
// one netlink socket.
type kernelTable struct{ c *nfnl.Conn }

// dump reads every entry of both families. A dump that concurrent
// changes kept interrupting gives what it read: the rest waits for the
// next flush.
func (t kernelTable) dump() ([][]byte, error) {
	msgs, err := t.c.DumpRaw(ctGet, []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0})
	if errors.Is(err, nfnl.ErrInterrupted) {
		err = nil
	}
	return msgs, err
}

func (t kernelTable) remove(family uint8, m []byte) error {
	_, err := t.c.Exec(ctDelete, append([]byte{family, unix.NFNETLINK_V0, 0, 0}, m[4:]...))
	return err
}

// local asks the kernel whether addr is the node's (the calling thread's
// namespace; see netns.Local). No answer is "not the node's", so nothing
// is flushed on it.
func (kernelTable) local(addr netip.Addr) bool { return netns.Local(addr) }

// origTuple reads an entry's key (family, original direction's protocol
// and destination port) and its original destination address from a
// dump message (nfgenmsg, then attributes).
func origTuple(m []byte) (key, netip.Addr, bool) {
	if len(m) < 4 {
		return key{}, netip.Addr{}, false
	}
	k := key{family: m[0]}
	orig, ok := nfnl.Find(m[4:], ctaTupleOrig)
	if !ok {
		return k, netip.Addr{}, false
	}
	proto, ok := nfnl.Find(orig, ctaTupleProto)
	if !ok {
		return k, netip.Addr{}, false
	}
	num, ok1 := nfnl.Find(proto, ctaProtoNum)
	port, ok2 := nfnl.Find(proto, ctaProtoDport)
	if !ok1 || !ok2 || len(num) < 1 || len(port) < 2 {
		return k, netip.Addr{}, false
	}
	k.proto, k.port = num[0], binary.BigEndian.Uint16(port)
	var dst netip.Addr
	if ip, ok := nfnl.Find(orig, ctaTupleIP); ok {
		attr := uint16(ctaIPv4Dst)
		if k.family == unix.AF_INET6 {
			attr = ctaIPv6Dst
		}
		if b, ok := nfnl.Find(ip, attr); ok {
			dst, _ = netip.AddrFromSlice(b)
		}
	}
	return k, dst, true
}

// replySource reads where an entry's replies come from: the source
// address and port of its reply tuple (for a DNATed flow, the
// container's).
func replySource(m []byte) (netip.AddrPort, bool) {
	if len(m) < 4 {
		return netip.AddrPort{}, false
	}
	reply, ok := nfnl.Find(m[4:], ctaTupleReply)
	if !ok {
		return netip.AddrPort{}, false
	}
	ip, ok1 := nfnl.Find(reply, ctaTupleIP)
	proto, ok2 := nfnl.Find(reply, ctaTupleProto)
	if !ok1 || !ok2 {
		return netip.AddrPort{}, false
	}
	attr := uint16(ctaIPv4Src)
	if m[0] == unix.AF_INET6 {
		attr = ctaIPv6Src
	}
	b, ok1 := nfnl.Find(ip, attr)
	port, ok2 := nfnl.Find(proto, ctaProtoSport)
	if !ok1 || !ok2 || len(port) < 2 {
		return netip.AddrPort{}, false
	}
	a, ok := netip.AddrFromSlice(b)
	if !ok {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(port)), true
}

// countPath is this namespace's number of conntrack entries.
var countPath = "/proc/sys/net/netfilter/nf_conntrack_count"

// count reads the namespace's number of conntrack entries: 0 where there
// is none to read (conntrack is not loaded); not known where the count
// cannot be read, which means "dump".
func count(path string) (n int, known bool) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, true
	}
	if err != nil {
		return 0, false
	}
	n, err = strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil
}

// procMax is the most entries a namespace may hold for a flush to read
// its procfs listing rather than dump it. At about 160 bytes a line, 256
// entries are 11 reads of 4 KiB. Before Linux 6.15 each read walks the
// hash from its first bucket again, so that is 11 walks: 1.7 ms beside an
// empty hash here, about 16 ms beside 40,000 entries of other namespaces,
// where the dump took 20 ms. From 6.15 a read resumes at its bucket and
// the listing costs what it holds: 1000 entries 2.4 ms (the dump 15),
// 5000 15 ms (24), 10,000 31 ms (44) on 6.18; there the limit is 4096.
// A wrong guess (a backport) costs the slower of two correct ways.
func procMax(release string) int {
	if nfnl.ReleaseAtLeast(release, 6, 15) {
		return 4096
	}
	return 256
}

// procPath is the calling thread's namespace's listing of its conntrack
// entries (/proc/net would be the main thread's namespace).
var procPath = "/proc/thread-self/net/nf_conntrack"

// procTable reads the table from its procfs listing and deletes through
// ctnetlink. A kernel without the listing, a listing with a line it
// cannot read, or a table holding an entry zoned in one direction only
// (which the message built from a line would not find) is dumped
// instead: the same entries, at the dump's cost.
type procTable struct {
	kernelTable
	path string
}

func (t procTable) dump() ([][]byte, error) {
	b, err := os.ReadFile(t.path)
	if err != nil {
		return t.kernelTable.dump()
	}
	msgs, err := parseProc(string(b))
	if err != nil {
		return t.kernelTable.dump()
	}
	return msgs, nil
}

// errDirZone is an entry whose zone applies to one direction.
var errDirZone = errors.New("conntrack entry zoned in one direction")

// ctnetlink's attributes of an address tuple and of the zone.
const (
	ctaIPv4Src    = 1
	ctaIPv6Src    = 3
	ctaProtoSport = 2
	ctaZone       = 18
)

// parseProc turns the lines of a procfs listing into the messages a dump
// would give for them: nfgenmsg, the original tuple, the zone. Entries
// without ports (ICMP, GRE …) are left out: no flush matches them.
//
//	ipv4     2 udp      17 29 src=198.51.100.2 dst=192.0.2.1 sport=40001 dport=53 [UNREPLIED] src=… zone=0 use=2
func parseProc(listing string) ([][]byte, error) {
	var msgs [][]byte
	for line := range strings.Lines(listing) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		var family uint8
		switch f[1] {
		case "2":
			family = unix.AF_INET
		case "10":
			family = unix.AF_INET6
		default:
			continue
		}
		proto, err := strconv.ParseUint(f[3], 10, 8)
		if err != nil {
			return nil, fmt.Errorf("read conntrack listing: protocol %q: %w", f[3], err)
		}
		// the original tuple, then the reply's
		var t [2]tuple
		var zone uint64
		var n [4]int // src, dst, sport, dport seen
		for _, kv := range f[4:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			var i int
			switch k {
			case "src", "dst", "sport", "dport":
				i = slices.Index([]string{"src", "dst", "sport", "dport"}, k)
				if n[i] == 2 {
					continue
				}
			case "zone":
				if zone, err = strconv.ParseUint(v, 10, 16); err != nil {
					return nil, fmt.Errorf("read conntrack listing: %s: %w", kv, err)
				}
				continue
			case "zone-orig", "zone-reply":
				return nil, errDirZone
			default:
				continue
			}
			d := &t[n[i]]
			switch i {
			case 0:
				d.src, err = netip.ParseAddr(v)
			case 1:
				d.dst, err = netip.ParseAddr(v)
			case 2:
				d.sport, err = parsePort(v)
			case 3:
				d.dport, err = parsePort(v)
			}
			if err != nil {
				return nil, fmt.Errorf("read conntrack listing: %s: %w", kv, err)
			}
			n[i]++
		}
		if n[0] == 0 || n[1] == 0 || n[2] == 0 || n[3] == 0 {
			continue
		}
		if n != [4]int{2, 2, 2, 2} {
			t[1] = tuple{}
		}
		msgs = append(msgs, entryMsg(family, uint8(proto), t[0], t[1], uint16(zone)))
	}
	return msgs, nil
}

// tuple is one direction of an entry.
type tuple struct {
	src, dst     netip.Addr
	sport, dport uint16
}

func parsePort(v string) (uint16, error) {
	p, err := strconv.ParseUint(v, 10, 16)
	return uint16(p), err
}

// entryMsg is the message naming one entry: its original tuple, its
// reply tuple (where reply's addresses are valid) and its zone.
func entryMsg(family, proto uint8, orig, reply tuple, zone uint16) []byte {
	var a nfnl.Attrs
	ipSrc := uint16(ctaIPv4Src)
	if family == unix.AF_INET6 {
		ipSrc = ctaIPv6Src
	}
	for i, d := range []tuple{orig, reply} {
		if !d.src.IsValid() || !d.dst.IsValid() {
			continue
		}
		a.Nested(uint16(ctaTupleOrig+i), func(a *nfnl.Attrs) {
			a.Nested(ctaTupleIP, func(a *nfnl.Attrs) {
				a.Raw(ipSrc, d.src.AsSlice())
				a.Raw(ipSrc+1, d.dst.AsSlice())
			})
			a.Nested(ctaTupleProto, func(a *nfnl.Attrs) {
				a.Raw(ctaProtoNum, []byte{proto})
				a.Raw(ctaProtoSport, binary.BigEndian.AppendUint16(nil, d.sport))
				a.Raw(ctaProtoDport, binary.BigEndian.AppendUint16(nil, d.dport))
			})
		})
	}
	if zone != 0 {
		a.Raw(ctaZone, binary.BigEndian.AppendUint16(nil, zone))
	}
	return append([]byte{family, unix.NFNETLINK_V0, 0, 0}, a.Bytes()...)
}
