// Package conntrack removes stale conntrack entries for host ports. A UDP or
// SCTP flow that started before the port was mapped keeps its old
// translation (often none) for as long as packets keep coming, so ADD, DEL
// and a repairing sync flush the entries whose original destination is a
// host port: its port, at an address of the node (the mapping's hostIP
// where it names one). The node's and its pods' flows to other hosts on
// the same port number are not the host port's, and are kept: an address
// is the node's when the kernel's route to it is of type local, which is
// what the DNAT rules' "fib daddr type local" and "--dst-type LOCAL" ask,
// looked up once per destination among the entries of a flushed port.
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

// Port is a host port of one family and protocol.
type Port struct {
	Family   plan.Family
	Protocol plan.Protocol
	Port     int
	// Addr is the mapping's hostIP; the zero Addr is every address of
	// the node. An Addr that is not the node's flushes nothing.
	Addr netip.Addr
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

// flush deletes the entries of t that ports name, after one dump: those
// of a port's family, protocol and port whose original destination is an
// address of the node, and the port's own address where it names one. An
// entry gone meanwhile is no failure.
func flush(t table, ports []Port) error {
	// per key, the addresses it names; an invalid one is any of the node's
	want := map[key][]netip.Addr{}
	for _, p := range ports {
		want[keyOf(p)] = append(want[keyOf(p)], p.Addr.Unmap())
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
		if !ok || !named(want[k], dst) || !isLocal(dst) {
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

// named reports whether one of addrs, the addresses a flushed port names,
// is dst: the same address, or the invalid Addr (any of the node's).
func named(addrs []netip.Addr, dst netip.Addr) bool {
	for _, a := range addrs {
		if !a.IsValid() || a == dst {
			return true
		}
	}
	return false
}

// ctnetlink's messages and attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctGet         = unix.NFNL_SUBSYS_CTNETLINK<<8 | 1 // IPCTNL_MSG_CT_GET
	ctDelete      = unix.NFNL_SUBSYS_CTNETLINK<<8 | 2 // IPCTNL_MSG_CT_DELETE
	ctaTupleOrig  = 1
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
		var src, dst netip.Addr
		var sport, dport, zone uint64
		var seen [4]bool
		for _, kv := range f[4:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			switch {
			case k == "src" && !seen[0]:
				src, err = netip.ParseAddr(v)
				seen[0] = true
			case k == "dst" && !seen[1]:
				dst, err = netip.ParseAddr(v)
				seen[1] = true
			case k == "sport" && !seen[2]:
				sport, err = strconv.ParseUint(v, 10, 16)
				seen[2] = true
			case k == "dport" && !seen[3]:
				dport, err = strconv.ParseUint(v, 10, 16)
				seen[3] = true
			case k == "zone":
				zone, err = strconv.ParseUint(v, 10, 16)
			case k == "zone-orig" || k == "zone-reply":
				return nil, errDirZone
			}
			if err != nil {
				return nil, fmt.Errorf("read conntrack listing: %s: %w", kv, err)
			}
		}
		if seen != [4]bool{true, true, true, true} {
			continue
		}
		msgs = append(msgs, entryMsg(family, src, dst, uint8(proto), uint16(sport), uint16(dport), uint16(zone)))
	}
	return msgs, nil
}

// entryMsg is the message naming one entry: its original tuple and zone.
func entryMsg(family uint8, src, dst netip.Addr, proto uint8, sport, dport, zone uint16) []byte {
	var a nfnl.Attrs
	ipSrc := uint16(ctaIPv4Src)
	if family == unix.AF_INET6 {
		ipSrc = ctaIPv6Src
	}
	a.Nested(ctaTupleOrig, func(a *nfnl.Attrs) {
		a.Nested(ctaTupleIP, func(a *nfnl.Attrs) {
			a.Raw(ipSrc, src.AsSlice())
			a.Raw(ipSrc+1, dst.AsSlice())
		})
		a.Nested(ctaTupleProto, func(a *nfnl.Attrs) {
			a.Raw(ctaProtoNum, []byte{proto})
			a.Raw(ctaProtoSport, binary.BigEndian.AppendUint16(nil, sport))
			a.Raw(ctaProtoDport, binary.BigEndian.AppendUint16(nil, dport))
		})
	})
	if zone != 0 {
		a.Raw(ctaZone, binary.BigEndian.AppendUint16(nil, zone))
	}
	return append([]byte{family, unix.NFNETLINK_V0, 0, 0}, a.Bytes()...)
}
