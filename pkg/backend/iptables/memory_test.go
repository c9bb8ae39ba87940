package iptables

import (
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
	return &Backend{Family: plan.IPv4, Kernel: m.Kernel(Table), Lock: func() (func(), error) { return func() {}, nil }}, m
}

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
	return m.Trace(Packet{Protocol: proto, Src: src, Dst: dst, Dport: port, FromHost: fromHost}, isLocal)
}

func dump(t *testing.T, m *Memory) string {
	t.Helper()
	var out []string
	for _, table := range []string{FilterTable, Table} {
		lines, _ := m.Kernel(table).ListTable()
		out = append(out, "*"+table)
		out = append(out, lines...)
	}
	return strings.Join(out, "\n")
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
	// Conditions are iptables matches of the entry rule.
	c := attachment("cond", "192.0.2.5/24", 7070)
	c.Conditions = []string{"!", "-s", "203.0.113.0/24"}
	if err := b.Apply(c); err != nil {
		t.Fatal(err)
	}
	if got := trace(m, plan.TCP, remote, hostIP, 7070, false); got.DNAT != "" {
		t.Errorf("a client the conditions exclude: %+v", got)
	}
	if got := trace(m, plan.TCP, net.ParseIP("192.0.2.200").To4(), hostIP, 7070, false); got.DNAT != "192.0.2.5:80" {
		t.Errorf("a client the conditions let through: %+v", got)
	}
}

// ADD → iptables -t nat -F → sync → DEL, on the in-memory kernel.
func TestMemoryAddFlushSyncDel(t *testing.T) {
	b, m := memBackend()
	p := fixture.TestPlan(plan.IPv4, nil)
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	afterAdd := dump(t, m)
	if err := b.Check(p); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	m.FlushTable(Table)
	if got := trace(m, plan.TCP, remote, hostIP, 8080, false); got.DNAT != "" {
		t.Errorf("after the flush: %+v", got)
	}
	if err := b.Check(p); err == nil {
		t.Error("CHECK after the flush succeeded")
	}
	rep, err := b.Sync([]*plan.Plan{p}, converge.Options{})
	if err != nil || rep.Results[0].State != converge.Repaired {
		t.Fatalf("sync: %+v, %v; want the attachment repaired", rep, err)
	}
	if got := dump(t, m); got != afterAdd {
		t.Errorf("after sync:\n%s\nwant what ADD wrote:\n%s", got, afterAdd)
	}
	if err := b.Check(p); err != nil {
		t.Errorf("CHECK after sync: %v", err)
	}
	n := m.Restores
	if rep, err := b.Sync([]*plan.Plan{p}, converge.Options{}); err != nil || rep.Wrote || len(rep.Shared) > 0 || rep.Results[0].State != converge.OK {
		t.Errorf("second sync: %+v, %v; want nothing to do", rep, err)
	}
	// The second pass's exact check is a restore of -C lines; it writes
	// nothing.
	if got := dump(t, m); got != afterAdd || m.Restores-n > 1 {
		t.Errorf("second sync changed the tables (%d restores)", m.Restores-n)
	}
	if err := b.Remove(p); err != nil {
		t.Fatal(err)
	}
	if got := trace(m, plan.TCP, remote, hostIP, 8080, false); got != (Verdict{}) {
		t.Errorf("after DEL: %+v", got)
	}
	if strings.Contains(dump(t, m), ChainName(p.Owner)) {
		t.Error("the attachment's chain or an entry rule survived DEL")
	}
	if err := b.Remove(p); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

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
		t.Errorf("8081: %+v, want the older", got)
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
}

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
}

// The refusals the fast paths rely on, as the in-memory kernel gives them
// (the kernel test TestIPTablesFastPathMisses holds the real ones), and a
// refused payload changes nothing.
func TestMemoryRefusals(t *testing.T) {
	b, m := memBackend()
	p := attachment("a", "192.0.2.2/24", 8080)
	k := m.Kernel(Table)
	if err := k.Restore(addPayload(p).bytes()); !Refused(err) {
		t.Errorf("fast ADD on an empty node: %v, want refused", err)
	}
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	before := dump(t, m)
	if err := k.Restore(addPayload(p).bytes()); !Refused(err) || !strings.Contains(err.Error(), "line") {
		t.Errorf("fast re-ADD: %v, want a refused line", err)
	}
	if dump(t, m) != before {
		t.Error("a refused payload changed the tables")
	}
}
