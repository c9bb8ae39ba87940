package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

func TestEmpty(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		content string
		want    bool
	}{{"0\n", true}, {"3\n", false}, {"", false}, {"x", false}} {
		p := filepath.Join(dir, "count")
		if err := os.WriteFile(p, []byte(tt.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := empty(p); got != tt.want {
			t.Errorf("empty(%q) = %v, want %v", tt.content, got, tt.want)
		}
	}
	if !empty(filepath.Join(dir, "absent")) {
		t.Error("no count file (conntrack not loaded) is not empty")
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

// The kernel's table of a namespace of the test's own: one dump, and the
// deletion of an entry it does not hold answers ENOENT, which a flush
// takes for "gone meanwhile".
func TestKernelTable(t *testing.T) {
	userns.Require(t)
	c, err := nfnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	kt := kernelTable{c}
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

func TestMain(m *testing.M) { userns.Main(m) }
