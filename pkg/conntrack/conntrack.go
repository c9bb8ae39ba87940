// Package conntrack removes stale conntrack entries for host ports. A UDP or
// SCTP flow that started before the port was mapped keeps its old
// translation (often none) for as long as packets keep coming, so ADD, DEL
// and a repairing sync flush the entries whose original destination is a
// host port.
//
// The kernel answers a conntrack dump by walking its whole hash table (it
// is shared by every namespace, 262144 buckets on a small machine), which
// costs milliseconds whatever it finds; so one flush is one dump of both
// families (AF_UNSPEC) for every port at once, and only the matching
// entries are deleted, each in its own family. A namespace whose conntrack
// table is empty (nf_conntrack_count, which is per namespace, reads 0, or
// conntrack is not loaded) has nothing stale, and no dump is made.
package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

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
// destination port are one of ports, with one dump of the table.
func (Host) FlushDstPorts(ports []Port) error {
	if len(ports) == 0 || empty(countPath) {
		return nil
	}
	return flush(kernelTable{}, ports)
}

// table is a conntrack table: one dump of every entry (messages as the
// kernel sends them: nfgenmsg, then attributes), one deletion.
type table interface {
	dump() ([][]byte, error)
	remove(family uint8, msg []byte) error
}

// flush deletes the entries of t that ports name, after one dump; an
// entry gone meanwhile is no failure.
func flush(t table, ports []Port) error {
	want := map[key]bool{}
	for _, p := range ports {
		want[keyOf(p)] = true
	}
	msgs, err := t.dump()
	if err != nil {
		return fmt.Errorf("dump conntrack entries: %w", err)
	}
	var errs []error
	for _, m := range msgs {
		k, ok := origKey(m)
		if !ok || !want[k] {
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

// kernelTable is the table of the calling thread's namespace.
type kernelTable struct{}

func (kernelTable) dump() ([][]byte, error) {
	var msgs [][]byte
	var err error
	for range 3 { // a dump interrupted by a concurrent change is retried
		req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
		req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
		if msgs, err = req.Execute(unix.NETLINK_NETFILTER, 0); !errors.Is(err, nl.ErrDumpInterrupted) {
			break
		}
	}
	if errors.Is(err, nl.ErrDumpInterrupted) {
		err = nil // what was read is used; the rest waits for the next flush
	}
	return msgs, err
}

func (kernelTable) remove(family uint8, m []byte) error {
	del := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
	del.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	del.AddRawData(m[4:])
	_, err := del.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}

// origKey reads an entry's family and its original direction's protocol
// and destination port from a dump message (nfgenmsg, then attributes).
func origKey(m []byte) (key, bool) {
	if len(m) < 4 {
		return key{}, false
	}
	k := key{family: m[0]}
	orig, ok := attr(m[4:], nl.CTA_TUPLE_ORIG)
	if !ok {
		return k, false
	}
	proto, ok := attr(orig, nl.CTA_TUPLE_PROTO)
	if !ok {
		return k, false
	}
	num, ok1 := attr(proto, nl.CTA_PROTO_NUM)
	port, ok2 := attr(proto, nl.CTA_PROTO_DST_PORT)
	if !ok1 || !ok2 || len(num) < 1 || len(port) < 2 {
		return k, false
	}
	k.proto, k.port = num[0], binary.BigEndian.Uint16(port)
	return k, true
}

// attr finds attribute typ among the netlink attributes in b.
func attr(b []byte, typ uint16) ([]byte, bool) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		t := binary.NativeEndian.Uint16(b[2:4]) & nl.NLA_TYPE_MASK
		if l < 4 || l > len(b) {
			return nil, false
		}
		if t == typ {
			return b[4:l], true
		}
		next := (l + 3) &^ 3
		if next > len(b) {
			return nil, false
		}
		b = b[next:]
	}
	return nil, false
}

// countPath is this namespace's number of conntrack entries.
var countPath = "/proc/sys/net/netfilter/nf_conntrack_count"

// empty reports whether the namespace holds no conntrack entry: its count
// reads 0, or there is none to read (conntrack is not loaded). Any other
// answer, including one that cannot be read, means "walk".
func empty(path string) bool {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	return err == nil && strings.TrimSpace(string(b)) == "0"
}
