package nftables

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

func memBackend() (*Backend, *Memory) {
	m := NewMemory()
	return &Backend{Family: plan.IPv4, Kernel: m, Lock: func() (func(), error) { return func() {}, nil }, Log: &bytes.Buffer{}}, m
}

// trace is nfttest's trace of a packet through the in-memory kernel,
// which runs the rules' expressions as written, in plan's terms.
func trace(t testing.TB, m *Memory, proto plan.Protocol, src, dst net.IP, port int, fromHost bool) plan.Verdict {
	t.Helper()
	v, err := m.nf.Trace(nfttest.Packet{Family: nft.IPv4, Proto: string(proto), Src: src, Dst: dst, Dport: port, Output: fromHost}, fixture.IsLocal)
	if err != nil {
		t.Fatal(err)
	}
	return plan.Verdict{DNAT: v.DNAT, Masquerade: v.Masquerade}
}

func TestMemoryTraceOfAnAttachment(t *testing.T) {
	b, m := memBackend()
	p := fixture.TestPlan(plan.IPv4, nil)
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	for _, tr := range fixture.Traces {
		pk := tr.Packet
		if got, want := trace(t, m, pk.Protocol, pk.Src, pk.Dst, pk.Dport, pk.FromHost), tr.Want(""); got != want {
			t.Errorf("%s: %+v, want %+v", tr.Name, got, want)
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
	if got := trace(t, m, plan.TCP, fixture.Remote, fixture.HostIP, 8080, false); got.DNAT != "" {
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
	n := m.Committed()
	if rep, err := b.Sync([]*plan.Plan{p}, converge.Options{}); err != nil || rep.Wrote || m.Committed() != n {
		t.Errorf("second sync wrote (%+v, %v)", rep, err)
	}

	if err := b.Remove(p); err != nil {
		t.Fatal(err)
	}
	if got := trace(t, m, plan.TCP, fixture.Remote, fixture.HostIP, 8080, false); got != (plan.Verdict{}) {
		t.Errorf("after DEL: %+v", got)
	}
	st, _ := m.Table(plan.IPv4, Table)
	for name := range st.Chains {
		if strings.HasPrefix(name, "dn-") {
			t.Errorf("chain %s left after DEL", name)
		}
	}
	if len(st.Elements) != 0 {
		t.Errorf("elements left after DEL: %v", st.Elements)
	}
	if err := b.Remove(p); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

// The same sequences as the other backend's, on the in-memory kernel,
// told by the tracer.
func TestMemoryTakeover(t *testing.T) {
	b, m := memBackend()
	fixture.Takeover(t, b, remoteDNAT(t, m))
}

// ADD again, and ADD of a port another attachment holds, read what they
// meet before they write: neither sends the kernel a batch it refuses
// (on the real kernel each costs an RCU grace period, ~15 ms), whatever
// the shape, and each leaves the newest attachment serving its ports.
func TestMemoryAddAgainRefusesNoBatch(t *testing.T) {
	c := fixture.Attachment("c", "192.0.2.4/24", 8081)
	d := fixture.Attachment("d", "192.0.2.5/24", 8081, 8082)
	r := rangePlan("r", "192.0.2.6/24", [2]int{20000, 20009})
	s := rangePlan("s", "192.0.2.7/24", [2]int{20005, 20019})
	b, m := memBackend()
	for i, p := range []*plan.Plan{c, c, d, d, r, r, s, s} {
		refused := m.Refused()
		if err := b.Apply(p); err != nil {
			t.Fatalf("ADD %d (%s): %v", i, p.Owner.ContainerID, err)
		}
		if err := b.Check(p); err != nil {
			t.Errorf("ADD %d (%s): CHECK: %v", i, p.Owner.ContainerID, err)
		}
		if i == 0 {
			continue // the node's first ADD finds no skeleton
		}
		if n := m.Refused() - refused; n != 0 {
			t.Errorf("ADD %d (%s): %d batches refused, want none", i, p.Owner.ContainerID, n)
		}
	}
	for port, want := range map[int]string{8081: "192.0.2.5:80", 8082: "192.0.2.5:80", 20004: "192.0.2.6:20004", 20005: "192.0.2.7:20005"} {
		if got := remoteDNAT(t, m)(port); got != want {
			t.Errorf("port %d goes to %q, want %s", port, got, want)
		}
	}
}

func TestMemoryGC(t *testing.T) {
	b, m := memBackend()
	fixture.GC(t, b, remoteDNAT(t, m))
}

func remoteDNAT(t testing.TB, m *Memory) fixture.DNAT {
	return func(port int) string { return trace(t, m, plan.TCP, fixture.Remote, fixture.HostIP, port, false).DNAT }
}

// The kernel's answers the fast paths rely on, as the in-memory kernel
// gives them (the kernel test TestNFTFastPathMisses holds the real ones).
func TestMemoryErrors(t *testing.T) {
	b, m := memBackend()
	p := fixture.Attachment("a", "192.0.2.2/24", 8080)
	p.Masquerade.MarkBit = 14 // not flat: a chain of rules
	f := fixture.Attachment("f", "192.0.2.3/24", 8081)
	if !layoutOf(f).flat || layoutOf(p).flat {
		t.Fatal("the plans are not of the two layouts")
	}
	if err := m.Apply(layoutOf(p).create()); !nft.IsNotFound(err) {
		t.Errorf("fast ADD on an empty node: %v, want ENOENT", err)
	}
	if err := m.Apply(layoutOf(f).create()); !nft.IsNotFound(err) {
		t.Errorf("fast flat ADD on an empty node: %v, want ENOENT", err)
	}
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	if err := b.Apply(f); err != nil {
		t.Fatal(err)
	}
	before := m.Dump()
	if err := m.Apply(layoutOf(p).create()); err == nil || nft.IsNotFound(err) || !missed(err) {
		t.Errorf("fast re-ADD: %v, want EEXIST", err)
	}
	if err := m.Apply(layoutOf(f).create()); err == nil || nft.IsNotFound(err) || !missed(err) {
		t.Errorf("fast flat re-ADD: %v, want EEXIST", err)
	}
	g := fixture.Attachment("g", "192.0.2.4/24", 8081) // f's port
	tx := newTx(plan.IPv4)
	for _, o := range layoutOf(g).create().Ops()[3:] { // without its chain and record: its element fails
		tx.Create(o.Obj)
	}
	if err := m.Apply(tx); err == nil || nft.IsNotFound(err) || !missed(err) {
		t.Errorf("fast flat ADD of a held port: %v, want EEXIST", err)
	}
	tx = newTx(plan.IPv4)
	tx.Delete(&nft.Chain{Name: ChainName(p.Owner)})
	if err := m.Apply(tx); !missed(err) || nft.IsNotFound(err) {
		t.Errorf("deleting a chain with rules: %v, want EBUSY", err)
	}
	if m.Dump() != before {
		t.Error("a failed transaction changed the state")
	}
}

// CHECK of an attachment whose port another took names that port.
func TestMemoryCheckNamesTheLostPort(t *testing.T) {
	b, _ := memBackend()
	older, newer := fixture.Attachment("older", "192.0.2.2/24", 8080, 8081), fixture.Attachment("newer", "192.0.2.3/24", 8080)
	for _, p := range []*plan.Plan{older, newer} {
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Check(older); err == nil || !strings.Contains(err.Error(), "tcp . 8080") {
		t.Errorf("CHECK of the older: %v, want the port it lost named", err)
	}
	if err := b.Check(newer); err != nil {
		t.Errorf("CHECK of the newer: %v", err)
	}
}

// Skeleton reads the table's shared chains alone: after ADD nothing is
// missing; with the dispatch chain emptied its lookups, some left; after
// `nft flush ruleset` the table's base chain, nothing left; after sync
// nothing missing again.
func TestMemorySkeleton(t *testing.T) {
	b, m := memBackend()
	p := fixture.TestPlan(plan.IPv4, nil)
	bare := plan.Build(plan.Request{Masquerade: p.Masquerade}, plan.IPv4, nil)
	if what, some, err := b.Skeleton(bare); err != nil || what == "" || some {
		t.Errorf("empty node: %q, some %v, %v; want what ADD makes named, none there", what, some, err)
	}
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	if what, some, err := b.Skeleton(bare); err != nil || what != "" || !some {
		t.Errorf("after ADD: %q, some %v, %v; want nothing missing", what, some, err)
	}
	empty := newTx(plan.IPv4)
	empty.Flush(&nft.Chain{Name: DispatchChain})
	if err := m.Apply(empty); err != nil {
		t.Fatal(err)
	}
	if what, some, err := b.Skeleton(bare); err != nil || !strings.Contains(what, "in chain "+DispatchChain) || !some {
		t.Errorf("dispatch chain emptied: %q, some %v, %v; want its lookup named, some left", what, some, err)
	}
	m.FlushRuleset()
	what, some, err := b.Skeleton(bare)
	if err != nil || !strings.Contains(what, "missing chain prerouting in table ip cni_portmap") || some {
		t.Errorf("after nft flush ruleset: %q, some %v, %v; want the prerouting chain named, none left", what, some, err)
	}
	if _, err := b.Sync([]*plan.Plan{p}, converge.Options{}); err != nil {
		t.Fatal(err)
	}
	if what, some, err := b.Skeleton(bare); err != nil || what != "" || !some {
		t.Errorf("after sync: %q, some %v, %v; want nothing missing", what, some, err)
	}
}
