package nftables

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

// The host of the traces: 198.51.100.1 is its address, 127.0.0.1 its
// loopback; 203.0.113.9 is a remote client.
var (
	hostIP   = net.ParseIP("198.51.100.1").To4()
	remote   = net.ParseIP("203.0.113.9").To4()
	loopback = net.ParseIP("127.0.0.1").To4()
)

func isLocal(ip net.IP) bool { return ip.Equal(hostIP) || ip.IsLoopback() }

func memBackend() (*Backend, *Memory) {
	m := NewMemory()
	return &Backend{Family: plan.IPv4, Kernel: m, Lock: func() (func(), error) { return func() {}, nil }, Log: &bytes.Buffer{}}, m
}

// attachment is the fixture plan of another container at ip with only
// the given TCP host ports (to container port 80).
func attachment(id, ip string, ports ...int) *plan.Plan {
	return fixture.TestPlan(plan.IPv4, func(r *plan.Request) {
		r.Owner.ContainerID = id
		r.Mappings = nil
		for _, p := range ports {
			r.Mappings = append(r.Mappings, plan.Mapping{HostPort: p, ContainerPort: 80, Protocol: plan.TCP})
		}
	}).WithIP(ip)
}

func trace(m *Memory, proto plan.Protocol, src, dst net.IP, port int, fromHost bool) Verdict {
	return m.Trace(plan.IPv4, Packet{Protocol: proto, Src: src, Dst: dst, Dport: port, FromHost: fromHost}, isLocal)
}

func TestMemoryTraceOfAnAttachment(t *testing.T) {
	b, m := memBackend()
	p := fixture.TestPlan(plan.IPv4, nil)
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	own := ChainName(p.Owner)
	tests := []struct {
		name     string
		proto    plan.Protocol
		src, dst net.IP
		port     int
		fromHost bool
		want     Verdict
	}{
		{"remote client, wildcard port", plan.TCP, remote, hostIP, 8080, false, Verdict{own, "192.0.2.2:80", false}},
		{"remote client, the other port", plan.TCP, remote, hostIP, 8443, false, Verdict{own, "192.0.2.2:443", false}},
		{"host IP mapping", plan.UDP, remote, hostIP, 8053, false, Verdict{own, "192.0.2.2:53", false}},
		{"SCTP", plan.SCTP, remote, hostIP, 9000, false, Verdict{own, "192.0.2.2:9000", false}},
		{"hairpin: masqueraded", plan.TCP, net.ParseIP("192.0.2.2").To4(), hostIP, 8080, false, Verdict{own, "192.0.2.2:80", true}},
		{"another container of the subnet: masqueraded", plan.TCP, net.ParseIP("192.0.2.77").To4(), hostIP, 8080, false, Verdict{own, "192.0.2.2:80", true}},
		{"localhost: masqueraded", plan.TCP, loopback, loopback, 8080, true, Verdict{own, "192.0.2.2:80", true}},
		{"the host to its own address", plan.TCP, hostIP, hostIP, 8080, true, Verdict{own, "192.0.2.2:80", false}},
		{"unmapped port", plan.TCP, remote, hostIP, 9999, false, Verdict{}},
		{"wrong protocol", plan.UDP, remote, hostIP, 8080, false, Verdict{}},
		{"host IP mapping, other address", plan.UDP, remote, loopback, 8053, true, Verdict{}},
		{"not a local address", plan.TCP, remote, net.ParseIP("192.0.2.99").To4(), 8080, false, Verdict{}},
	}
	for _, tt := range tests {
		if got := trace(m, tt.proto, tt.src, tt.dst, tt.port, tt.fromHost); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// ADD → a firewall flush → sync → DEL, on the in-memory kernel: the flush
// breaks forwarding and CHECK, sync puts back exactly what ADD wrote (a
// second pass writes nothing), DEL leaves only the skeleton.
func TestMemoryAddFlushSyncDel(t *testing.T) {
	b, m := memBackend()
	p := fixture.TestPlan(plan.IPv4, nil)
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	afterAdd := m.Dump()
	if err := b.Check(p); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}

	m.FlushRuleset()
	if got := trace(m, plan.TCP, remote, hostIP, 8080, false); got.DNAT != "" {
		t.Errorf("after the flush: %+v, want nothing translated", got)
	}
	if err := b.Check(p); err == nil || !strings.Contains(err.Error(), "missing chain") {
		t.Errorf("CHECK after the flush: %v, want a missing chain named", err)
	}

	rep, err := b.Sync([]*plan.Plan{p}, converge.Options{})
	if err != nil || rep.Results[0].State != converge.Repaired || !rep.Wrote {
		t.Fatalf("sync: %+v, %v; want the attachment repaired", rep, err)
	}
	if got := m.Dump(); got != afterAdd {
		t.Errorf("after sync:\n%s\nwant what ADD wrote:\n%s", got, afterAdd)
	}
	if err := b.Check(p); err != nil {
		t.Errorf("CHECK after sync: %v", err)
	}
	n := m.Committed
	if rep, err := b.Sync([]*plan.Plan{p}, converge.Options{}); err != nil || rep.Wrote || m.Committed != n {
		t.Errorf("second sync wrote (%+v, %v)", rep, err)
	}

	if err := b.Remove(p); err != nil {
		t.Fatal(err)
	}
	if got := trace(m, plan.TCP, remote, hostIP, 8080, false); got != (Verdict{}) {
		t.Errorf("after DEL: %+v", got)
	}
	st, _ := m.Table(plan.IPv4, Table)
	for name := range st.Chains {
		if strings.HasPrefix(name, "dn-") {
			t.Errorf("chain %s left after DEL", name)
		}
	}
	if len(st.Holders) != 0 {
		t.Errorf("elements left after DEL: %v", st.Holders)
	}
	if err := b.Remove(p); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

// Two attachments of one port: the newest ADD wins, DEL of the older
// keeps the newer's mapping, DEL of the newer ends it.
func TestMemoryTakeover(t *testing.T) {
	b, m := memBackend()
	older, newer := attachment("older", "192.0.2.2/24", 8080, 8081), attachment("newer", "192.0.2.3/24", 8080)
	for _, p := range []*plan.Plan{older, newer} {
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	if got := trace(m, plan.TCP, remote, hostIP, 8080, false); got.DNAT != "192.0.2.3:80" {
		t.Errorf("8080 after both ADDs: %+v, want the newer", got)
	}
	if got := trace(m, plan.TCP, remote, hostIP, 8081, false); got.DNAT != "192.0.2.2:80" {
		t.Errorf("8081: %+v, want the older, which still has it", got)
	}
	if err := b.Check(older); err == nil || !strings.Contains(err.Error(), "tcp . 8080") {
		t.Errorf("CHECK of the older: %v, want the port it lost named", err)
	}
	if err := b.Remove(older); err != nil {
		t.Fatal(err)
	}
	if got := trace(m, plan.TCP, remote, hostIP, 8080, false); got.DNAT != "192.0.2.3:80" {
		t.Errorf("8080 after DEL of the older: %+v, want the newer kept", got)
	}
	if got := trace(m, plan.TCP, remote, hostIP, 8081, false); got.DNAT != "" {
		t.Errorf("8081 after DEL of its owner: %+v", got)
	}
	if err := b.Remove(newer); err != nil {
		t.Fatal(err)
	}
	if got := trace(m, plan.TCP, remote, hostIP, 8080, false); got.DNAT != "" {
		t.Errorf("8080 after both DELs: %+v", got)
	}
}

// GC after a crash: of a network's attachments only the valid ones keep
// their ports; another network's attachment of the same container ID
// stays.
func TestMemoryGC(t *testing.T) {
	b, m := memBackend()
	gone, kept := attachment("gone", "192.0.2.2/24", 8080), attachment("kept", "192.0.2.3/24", 8081)
	other := attachment("gone", "192.0.2.4/24", 8082)
	other.Owner.Network = "net2"
	for _, p := range []*plan.Plan{gone, kept, other} {
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.GC("net1", []plan.Owner{kept.Owner}); err != nil {
		t.Fatal(err)
	}
	for port, want := range map[int]string{8080: "", 8081: "192.0.2.3:80", 8082: "192.0.2.4:80"} {
		if got := trace(m, plan.TCP, remote, hostIP, port, false); got.DNAT != want {
			t.Errorf("%d after GC: %+v, want %q", port, got, want)
		}
	}
	if c, _ := m.Chain(plan.IPv4, Table, ChainName(gone.Owner)); c != nil {
		t.Error("the invalid attachment's chain survived GC")
	}
}

// The kernel's answers the fast paths rely on, as the in-memory kernel
// gives them (the kernel test TestNFTFastPathMisses holds the real ones).
func TestMemoryErrors(t *testing.T) {
	b, m := memBackend()
	p := attachment("a", "192.0.2.2/24", 8080)
	if err := m.Apply(fastAddTx(p)); !IsNotFound(err) {
		t.Errorf("fast ADD on an empty node: %v, want ENOENT", err)
	}
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	before := m.Dump()
	if err := m.Apply(fastAddTx(p)); err == nil || IsNotFound(err) || !missed(err) {
		t.Errorf("fast re-ADD: %v, want EEXIST", err)
	}
	tx := newTx(plan.IPv4)
	tx.add(opDelete, chainObj{name: ChainName(p.Owner)})
	if err := m.Apply(tx); !missed(err) || IsNotFound(err) {
		t.Errorf("deleting a chain with rules: %v, want EBUSY", err)
	}
	if m.Dump() != before {
		t.Error("a failed transaction changed the state")
	}
}
