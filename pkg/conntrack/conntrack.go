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

	"golang.org/x/sys/unix"

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
	c, err := nfnl.Open()
	if err != nil {
		return fmt.Errorf("flush conntrack entries: %w", err)
	}
	defer c.Close()
	return flush(kernelTable{c}, ports)
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

// ctnetlink's messages and attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctGet         = unix.NFNL_SUBSYS_CTNETLINK<<8 | 1 // IPCTNL_MSG_CT_GET
	ctDelete      = unix.NFNL_SUBSYS_CTNETLINK<<8 | 2 // IPCTNL_MSG_CT_DELETE
	ctaTupleOrig  = 1
	ctaTupleProto = 2
	ctaProtoNum   = 1
	ctaProtoDport = 3
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

// origKey reads an entry's family and its original direction's protocol
// and destination port from a dump message (nfgenmsg, then attributes).
func origKey(m []byte) (key, bool) {
	if len(m) < 4 {
		return key{}, false
	}
	k := key{family: m[0]}
	orig, ok := nfnl.Find(m[4:], ctaTupleOrig)
	if !ok {
		return k, false
	}
	proto, ok := nfnl.Find(orig, ctaTupleProto)
	if !ok {
		return k, false
	}
	num, ok1 := nfnl.Find(proto, ctaProtoNum)
	port, ok2 := nfnl.Find(proto, ctaProtoDport)
	if !ok1 || !ok2 || len(num) < 1 || len(port) < 2 {
		return k, false
	}
	k.proto, k.port = num[0], binary.BigEndian.Uint16(port)
	return k, true
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
