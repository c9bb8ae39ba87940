package iptables

import (
	"cmp"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/pkg/xt/xttest"
	"github.com/portmap-dev/portmap/test/fixture"
)

func memBackend() (*Backend, *xttest.Memory) {
	m := xttest.New(xt.NativeExprs)
	return &Backend{Family: plan.IPv4, Kernel: m.Kernel(Table), Lock: func() (func(), error) { return func() {}, nil }}, m
}

func trace(m *xttest.Memory, proto plan.Protocol, src, dst net.IP, port int, fromHost bool) plan.Verdict {
	return traceMemory(m, plan.Packet{Protocol: proto, Src: src, Dst: dst, Dport: port, FromHost: fromHost}, fixture.IsLocal)
}

func dump(t *testing.T, m *xttest.Memory) string {
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
	for _, tr := range fixture.Traces {
		if got, want := traceMemory(m, tr.Packet, fixture.IsLocal), tr.Want(ChainName(p.Owner)); got != want {
			t.Errorf("%s: %+v, want %+v", tr.Name, got, want)
		}
	}
	// Conditions are iptables matches of the entry rule.
	c := fixture.Attachment("cond", "192.0.2.5/24", 7070)
	c.Conditions = []string{"!", "-s", "203.0.113.0/24"}
	if err := b.Apply(c); err != nil {
		t.Fatal(err)
	}
	if got := trace(m, plan.TCP, fixture.Remote, fixture.HostIP, 7070, false); got.DNAT != "" {
		t.Errorf("a client the conditions exclude: %+v", got)
	}
	if got := trace(m, plan.TCP, net.ParseIP("192.0.2.200").To4(), fixture.HostIP, 7070, false); got.DNAT != "192.0.2.5:80" {
		t.Errorf("a client the conditions let through: %+v", got)
	}
}

// ADD of a new attachment after a flush (`iptables -t nat -F` empties
// every chain and deletes none: the fast path's marker chain survives;
// or POSTROUTING alone, whose jump is judged by CNI-HOSTPORT-MASQ's
// references) makes the shared rules again: the new attachment's host
// port works and passes CHECK; the older one's CHECK fails until sync.
// On iptables-legacy the marker alone decides (no netlink to read).
func TestMemoryAddAfterFlush(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flush func(m *xttest.Memory)
	}{
		{"table", func(m *xttest.Memory) { m.FlushTable(Table) }},
		{"POSTROUTING", func(m *xttest.Memory) {
			if err := m.Kernel(Table).Restore([]byte("*nat\n-F POSTROUTING\nCOMMIT\n")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, m := memBackend()
			old := fixture.TestPlan(plan.IPv4, nil)
			if err := b.Apply(old); err != nil {
				t.Fatal(err)
			}
			tc.flush(m)
			p := fixture.TestPlan(plan.IPv4, func(r *plan.Request) {
				r.Owner.ContainerID = "after-the-flush"
				r.Mappings = plan.MappingsOf(plan.Mapping{HostPort: 7070, ContainerPort: 80, Protocol: plan.TCP})
			})
			if err := b.Apply(p); err != nil {
				t.Fatal(err)
			}
			if got := trace(m, plan.TCP, fixture.Remote, fixture.HostIP, 7070, false); got.DNAT == "" {
				t.Errorf("the host port of an ADD after the flush: %+v, want it forwarded", got)
			}
			if got := trace(m, plan.TCP, fixture.Loopback, fixture.Loopback, 7070, true); got.DNAT == "" || !got.Masquerade {
				t.Errorf("127.0.0.1 to the host port of an ADD after the flush: %+v, want it forwarded and masqueraded", got)
			}
			if err := b.Check(p); err != nil {
				t.Errorf("CHECK of the ADD after the flush: %v", err)
			}
			if err := b.Check(old); err == nil && tc.name == "table" {
				t.Error("CHECK of the attachment the flush emptied succeeded")
			}
		})
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
	if got := trace(m, plan.TCP, fixture.Remote, fixture.HostIP, 8080, false); got.DNAT != "" {
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
	if got := trace(m, plan.TCP, fixture.Remote, fixture.HostIP, 8080, false); got != (plan.Verdict{}) {
		t.Errorf("after DEL: %+v", got)
	}
	if strings.Contains(dump(t, m), ChainName(p.Owner)) {
		t.Error("the attachment's chain or an entry rule survived DEL")
	}
	if err := b.Remove(p); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

// The same sequences as the other backend's, on the in-memory kernel,
// told by the tracer.
func TestMemoryTakeover(t *testing.T) {
	b, m := memBackend()
	fixture.Takeover(t, b, remoteDNAT(m))
}

func TestMemoryGC(t *testing.T) {
	b, m := memBackend()
	fixture.GC(t, b, remoteDNAT(m))
}

func remoteDNAT(m *xttest.Memory) fixture.DNAT {
	return func(port int) string { return trace(m, plan.TCP, fixture.Remote, fixture.HostIP, port, false).DNAT }
}

// The refusals the fast paths rely on, as the in-memory kernel gives them
// (the kernel test TestIPTablesFastPathMisses holds the real ones), and a
// refused payload changes nothing.
func TestMemoryRefusals(t *testing.T) {
	b, m := memBackend()
	p := fixture.Attachment("a", "192.0.2.2/24", 8080)
	k := m.Kernel(Table)
	if err := k.Restore(addPayload(layoutOf(p)).bytes()); !Missed(err) {
		t.Errorf("fast ADD on an empty node: %v, want refused", err)
	}
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	before := dump(t, m)
	if err := k.Restore(addPayload(layoutOf(p)).bytes()); !Missed(err) || !strings.Contains(err.Error(), "line") {
		t.Errorf("fast re-ADD: %v, want a refused line", err)
	}
	if dump(t, m) != before {
		t.Error("a refused payload changed the tables")
	}
}

// CHECK judges the attachment's chain — over nf_tables netlink from one
// listing of it and the jumps to it from the chain alone, on
// iptables-legacy from one listing of the table: it names the rule that
// is missing or wrong, and finds a rule too many, a missing entry rule and
// a missing shared rule.
func TestCheckJudgesTheChain(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%t", legacy), func(t *testing.T) { checkJudgesTheChain(t, legacy) })
	}
}

func checkJudgesTheChain(t *testing.T, legacy bool) {
	p := fixture.TestPlan(plan.IPv4, nil)
	chain := ChainName(p.Owner)
	dnat8443 := "-A " + chain + " -p tcp --dport 8443 -j DNAT --to-destination 192.0.2.2:443"
	for _, tc := range []struct {
		name, change, want string
	}{
		{"a DNAT rule missing", "-D" + dnat8443[2:], "--dport 8443"},
		{"a DNAT rule to another port", "-D" + dnat8443[2:] + "\n" + dnat8443 + "4", "--dport 8443"},
		{"a rule too many", "-A " + chain + " -p tcp --dport 9999 -j DNAT --to-destination 192.0.2.2:1", "1 unexpected rules"},
		{"the chain's entry rule missing", "-F " + TopLevelDNATChain, "entry rules in " + TopLevelDNATChain},
		{"the PREROUTING jump missing", "-F PREROUTING", "PREROUTING"},
		{"the POSTROUTING jump missing", "-F POSTROUTING", masqChain},
		{"the mark rule missing", "-F " + SetMarkChain, SetMarkChain},
	} {
		t.Run(tc.name, func(t *testing.T) { tamperThenCheck(t, p, legacy, tc.change, tc.want) })
	}
}

// tamperThenCheck applies p, changes the nat table by change (an
// iptables-restore line) and wants CHECK to fail naming want.
func tamperThenCheck(t *testing.T, p *plan.Plan, legacy bool, change, want string) {
	t.Helper()
	b, m := memBackend()
	m.Legacy = legacy
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(p); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	if err := m.Kernel(Table).Restore([]byte("*nat\n" + change + "\nCOMMIT\n")); err != nil {
		t.Fatalf("%s: %v", change, err)
	}
	if err := b.Check(p); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("after %q: CHECK = %v, want an error naming %q", change, err, want)
	}
}

// Ranges are one rule each; the tracer follows them to the first, a
// middle and the last port, and listing expands them to one mapping per
// port.
func TestMemoryRanges(t *testing.T) {
	b, m := memBackend()
	p := fixture.TestPlan(plan.IPv4, fixture.Ranges)
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(p); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	table, _ := b.Kernel.ListTable()
	lines := parseListing(table).rules[ChainName(p.Owner)]
	if got, want := len(lines), 3*4; got != want {
		t.Errorf("the chain holds %d rules, want %d (three per run):\n%s", got, want, strings.Join(lines, "\n"))
	}
	host := net.ParseIP("198.51.100.1").To4()
	for _, tc := range []struct {
		proto plan.Protocol
		dst   net.IP
		port  int
		want  string
	}{
		{plan.TCP, fixture.HostIP, 10000, "192.0.2.2:10000"},
		{plan.TCP, fixture.HostIP, 10500, "192.0.2.2:10500"},
		{plan.TCP, fixture.HostIP, 10999, "192.0.2.2:10999"},
		{plan.TCP, fixture.HostIP, 11000, ""},
		{plan.TCP, fixture.HostIP, 7070, "192.0.2.2:80"},
		{plan.TCP, fixture.HostIP, 8000, "192.0.2.2:9000"},
		{plan.TCP, fixture.HostIP, 8010, "192.0.2.2:9010"},
		{plan.UDP, host, 5001, "192.0.2.2:5001"},
		{plan.UDP, net.ParseIP("198.51.100.9").To4(), 5001, ""},
		{plan.UDP, host, 10000, ""},
	} {
		if got := trace(m, tc.proto, fixture.Remote, tc.dst, tc.port, false); got.DNAT != tc.want {
			t.Errorf("%s to %s:%d: DNAT %q, want %q", tc.proto, tc.dst, tc.port, got.DNAT, tc.want)
		}
	}
	all, err := b.Mappings()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != p.Mappings.Len() {
		t.Errorf("listing shows %d mappings, want %d", len(all), p.Mappings.Len())
	}
	for _, f := range all {
		if f.HostPort == 8005 && f.ContainerPort != 9005 {
			t.Errorf("listing: 8005 -> %d, want 9005", f.ContainerPort)
		}
	}
}

// Skeleton reads the shared rules alone: nothing missing on an empty node
// is not its question (STATUS asks the cache), so it names what ADD would
// make, none there; after ADD nothing; with the masquerade chain emptied,
// its rule; after `iptables -t nat -F` the jumps from the built-in chains,
// our chains left; after -F and -X of both tables none left (on
// iptables-legacy it cannot tell and says some); after sync nothing again. Over netlink
// (iptables-nft) and by -C lines (iptables-legacy) alike.
func TestMemorySkeleton(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			b, m := memBackend()
			m.Legacy = legacy
			p := fixture.TestPlan(plan.IPv4, nil)
			bare := plan.Build(plan.Request{Masquerade: p.Masquerade}, plan.IPv4, nil)
			if what, some, err := b.Skeleton(bare); err != nil || what == "" || some != legacy {
				t.Errorf("empty node: %q, some %v, %v; want what ADD makes named, some %v", what, some, err, legacy)
			}
			if err := b.Apply(p); err != nil {
				t.Fatal(err)
			}
			before, restores := dump(t, m), m.Restores
			if what, some, err := b.Skeleton(bare); err != nil || what != "" || !some {
				t.Errorf("after ADD: %q, some %v, %v; want nothing missing", what, some, err)
			}
			if dump(t, m) != before {
				t.Errorf("Skeleton changed the tables")
			}
			if !legacy && m.Restores != restores {
				t.Errorf("Skeleton on nf_tables ran iptables-restore %d times", m.Restores-restores)
			}
			if err := m.Kernel(Table).Restore([]byte("*nat\n-F " + masqChain + "\nCOMMIT\n")); err != nil {
				t.Fatal(err)
			}
			if what, some, err := b.Skeleton(bare); err != nil || !strings.Contains(what, "-A "+masqChain) || !some {
				t.Errorf("masquerade chain emptied: %q, some %v, %v; want its rule named, some left", what, some, err)
			}
			m.FlushTable(Table)
			what, some, err := b.Skeleton(bare)
			if err != nil || !strings.Contains(what, "PREROUTING") || !some {
				t.Errorf("after iptables -t nat -F: %q, some %v, %v; want the PREROUTING jump named, our chains left", what, some, err)
			}
			m.Flush()
			if what, some, err := b.Skeleton(bare); err != nil || what == "" || some != legacy {
				t.Errorf("after -F -X of the nat and filter tables: %q, some %v, %v; want what is missing named, some %v", what, some, err, legacy)
			}
			if _, err := b.Sync([]*plan.Plan{p}, converge.Options{}); err != nil {
				t.Fatal(err)
			}
			if what, some, err := b.Skeleton(bare); err != nil || what != "" || !some {
				t.Errorf("after sync: %q, some %v, %v; want nothing missing", what, some, err)
			}
		})
	}
}

// An attachment with many rules is judged from one listing of its chain
// alone, as every attachment is (a -C per rule would read the chain once
// per rule).
func TestCheckJudgesAChainOfManyRules(t *testing.T) {
	p := fixture.TestPlan(plan.IPv4, func(r *plan.Request) {
		r.Mappings = plan.Mappings{}
		for i := range 20 {
			r.Mappings.Add(plan.Mapping{HostPort: 9000 + 2*i, ContainerPort: 80, Protocol: plan.TCP})
		}
	})
	chain := ChainName(p.Owner)
	for _, tc := range []struct{ change, want string }{
		{"-D " + chain + " -p tcp --dport 9010 -j DNAT --to-destination 192.0.2.2:80", "--dport 9010"},
		{"-A " + chain + " -p tcp --dport 1 -j ACCEPT", "1 unexpected rules"},
	} {
		tamperThenCheck(t, p, false, tc.change, tc.want)
	}
}

// recordingKernel records what a verb reads of the kernel. A pass lists
// the table while it runs the exact check: calls are appended under mu.
type recordingKernel struct {
	xt.Kernel
	mu    sync.Mutex
	calls []string
}

func (k *recordingKernel) record(call string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, call)
}

func (k *recordingKernel) Restore(payload []byte) error {
	k.record("restore")
	return k.Kernel.Restore(payload)
}

func (k *recordingKernel) Test(payload []byte) error {
	k.record("test")
	return k.Kernel.Test(payload)
}

func (k *recordingKernel) Writable() error {
	k.record("probe")
	return k.Kernel.Writable()
}

func (k *recordingKernel) ListTable() ([]string, error) {
	k.record("list table")
	return k.Kernel.ListTable()
}

func (k *recordingKernel) ListChain(chain string) ([]string, error) {
	k.record("list " + chain)
	return k.Kernel.ListChain(chain)
}

func (k *recordingKernel) Chains(table string, names []string, rules bool) (map[string]xt.ChainSummary, error) {
	if rules {
		k.record("dump " + strings.Join(names, ","))
	}
	return k.Kernel.Chains(table, names, rules)
}

// CHECK over nf_tables netlink reads no table and no chain that grows with
// the attachments but the attachment's own: no restore, no listing of the
// table, no rule dump of POSTROUTING (a masquerade rule per ptp or bridge
// container) or of CNI-HOSTPORT-DNAT (an entry rule per mapping group),
// one listing of the attachment's chain. With conditions, the entry rules
// are compared by -C in one restore.
func TestCheckReadsNoTable(t *testing.T) {
	for _, conditions := range []bool{false, true} {
		b, _ := memBackend()
		p := fixture.TestPlan(plan.IPv4, nil)
		if conditions {
			p = fixture.TestPlan(plan.IPv4, func(r *plan.Request) { r.ConditionsV4 = []string{"-s", "192.0.2.0/24"} })
		}
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
		k := &recordingKernel{Kernel: b.Kernel}
		b.Kernel = k
		if err := b.Check(p); err != nil {
			t.Fatalf("conditions %v: CHECK: %v", conditions, err)
		}
		restores := 0
		for _, c := range k.calls {
			switch {
			case c == "restore":
				restores++
			case c == "list table",
				strings.HasPrefix(c, "list ") && c != "list "+ChainName(p.Owner),
				strings.HasPrefix(c, "dump ") && (strings.Contains(c, "POSTROUTING") || strings.Contains(c, TopLevelDNATChain+",") || strings.HasSuffix(c, TopLevelDNATChain)):
				t.Errorf("conditions %v: CHECK read %q (all: %q)", conditions, c, k.calls)
			}
		}
		if want := map[bool]int{false: 0, true: 1}[conditions]; restores != want {
			t.Errorf("conditions %v: %d restores, want %d (%q)", conditions, restores, want, k.calls)
		}
		// The masquerade chain is read once, its references judging
		// POSTROUTING's jump; STATUS reads the same way.
		masq := 0
		for _, c := range k.calls {
			if strings.HasPrefix(c, "dump ") && strings.Contains(c, masqChain) {
				masq++
			}
		}
		if masq != 1 {
			t.Errorf("conditions %v: CHECK read %s %d times (%q)", conditions, masqChain, masq, k.calls)
		}
		k.calls = nil
		if what, _, err := b.Skeleton(p); err != nil || what != "" {
			t.Fatalf("STATUS's skeleton: %q %v", what, err)
		}
		for _, c := range k.calls {
			if strings.HasPrefix(c, "dump ") && (strings.Contains(c, "POSTROUTING") || strings.Contains(c, TopLevelDNATChain)) {
				t.Errorf("STATUS's skeleton read %q", c)
			}
		}
	}
}

// A pass after a plan's externalSetMarkChain went away (a firewall flush
// before kube-proxy makes its chains again): that plan is an error that
// names the key, and is left out of the one restore, which repairs the
// others.
func TestSyncLeavesOutAMissingMarkChain(t *testing.T) {
	b, m := memBackend()
	k := m.Kernel(Table)
	if err := k.EnsureChain(xt.Chain{Table: Table, Name: "KUBE-MARK-MASQ"}); err != nil {
		t.Fatal(err)
	}
	a := fixture.TestPlan(plan.IPv4, func(r *plan.Request) {
		r.Owner.ContainerID = "a"
		r.Masquerade.ExternalSetMarkChain = "KUBE-MARK-MASQ"
		r.Mappings = plan.MappingsOf(plan.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP})
	})
	other := fixture.TestPlan(plan.IPv4, func(r *plan.Request) {
		r.Owner.ContainerID = "b"
		r.Mappings = plan.MappingsOf(plan.Mapping{HostPort: 9090, ContainerPort: 80, Protocol: plan.TCP})
	})
	for _, p := range []*plan.Plan{a, other} {
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	flush := "*nat\n-F " + ChainName(a.Owner) + "\n-F " + ChainName(other.Owner) + "\n-X KUBE-MARK-MASQ\nCOMMIT\n"
	if err := k.Restore([]byte(flush)); err != nil {
		t.Fatal(err)
	}
	rep, err := b.Sync([]*plan.Plan{a, other}, converge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Results[0]; r.State != converge.Error || !strings.Contains(r.What, `cannot repair: invalid externalSetMarkChain "KUBE-MARK-MASQ"`) {
		t.Errorf("a: %+v, want an error naming the key", r)
	}
	if r := rep.Results[1]; r.State != converge.Repaired {
		t.Errorf("b: %+v, want repaired", r)
	}
	if err := b.Check(other); err != nil {
		t.Errorf("CHECK of b after the pass: %v", err)
	}
	if got := trace(m, plan.TCP, fixture.Remote, fixture.HostIP, 9090, false).DNAT; got == "" {
		t.Error("b's host port goes nowhere after the pass")
	}
}

// A pass over nf_tables reads our chains over netlink and, when they hold
// what is wanted, nothing else: no listing of the table (kube-proxy's
// chains are in it), no restore of -C lines. Anything it cannot call
// steady — a chain emptied, an orphan's entry rule, a plan with
// conditions — is read as before, and repaired.
func TestSyncSteadyReadsOurChainsOnly(t *testing.T) {
	tools := func(k *recordingKernel) (n int) {
		for _, c := range k.calls {
			if c == "restore" || c == "test" || strings.HasPrefix(c, "list ") {
				n++
			}
		}
		return n
	}
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, m *xttest.Memory, a, b *plan.Plan)
		want   []*plan.Plan // nil: a and b
		tools  bool         // the pass runs the tools (lists or restores)
		state  converge.State
	}{
		{name: "steady"},
		{name: "chain emptied", tools: true, state: converge.Repaired, break_: func(t *testing.T, m *xttest.Memory, a, _ *plan.Plan) {
			restore(t, m, "*nat\n-F "+ChainName(a.Owner)+"\nCOMMIT\n")
		}},
		{name: "entry rule deleted", tools: true, state: converge.Repaired, break_: func(t *testing.T, m *xttest.Memory, a, _ *plan.Plan) {
			r := EntryRules(a)[0]
			restore(t, m, "*nat\n-D "+r.Chain+" "+xt.QuoteArgs(r.Args())+"\nCOMMIT\n")
		}},
		{name: "mark rule flushed", tools: true, break_: func(t *testing.T, m *xttest.Memory, _, _ *plan.Plan) {
			restore(t, m, "*nat\n-F "+SetMarkChain+"\nCOMMIT\n")
		}},
		{name: "an orphan's entry rule", tools: true, break_: func(t *testing.T, _ *xttest.Memory, _, _ *plan.Plan) {}, want: []*plan.Plan{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, m := memBackend()
			// TCP and UDP, one with a hostIP (the native writer does not
			// write SCTP: such a plan is read as before)
			pa := fixture.TestPlan(plan.IPv4, func(r *plan.Request) {
				r.Mappings = plan.Mappings{}
				r.Mappings.Add(plan.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP})
				r.Mappings.Add(plan.Mapping{HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP, HostIP: fixture.HostIP})
			})
			pb := fixture.Attachment("b", "192.0.2.5/24", 7070, 7071)
			for _, p := range []*plan.Plan{pa, pb} {
				if err := b.Apply(p); err != nil {
					t.Fatal(err)
				}
			}
			restore(t, m, "*nat\n-N KUBE-SERVICES\n-A KUBE-SERVICES -p tcp -d 10.96.0.1/32 --dport 443 -j ACCEPT\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n")
			want := []*plan.Plan{pa, pb}
			if tc.want != nil {
				want = []*plan.Plan{pa}
			}
			if tc.break_ != nil {
				tc.break_(t, m, pa, pb)
			}
			k := &recordingKernel{Kernel: b.Kernel}
			b.Kernel = k
			rep, err := b.Sync(want, converge.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := tools(k) > 0; got != tc.tools {
				t.Errorf("the pass ran the tools: %v, want %v (%q)", got, tc.tools, k.calls)
			}
			if want := cmp.Or(tc.state, converge.OK); rep.Results[0].State != want {
				t.Errorf("a: %+v, want %v", rep.Results[0], want)
			}
			if tc.want != nil && (len(rep.Orphans) != 1 || rep.Orphans[0].ContainerID != pb.Owner.ContainerID) {
				t.Errorf("orphans %+v, want b's chain", rep.Orphans)
			}
			if tc.want != nil {
				return
			}
			// whatever was broken is repaired: the next pass is steady
			k.calls = nil
			if rep, err := b.Sync(want, converge.Options{}); err != nil || rep.Wrote || tools(k) > 0 {
				t.Errorf("the next pass: %+v, %v, calls %q; want steady", rep, err, k.calls)
			}
		})
	}
	// a plan with conditions is judged by iptables' -C; SCTP is read
	// from the listing
	for _, p := range []*plan.Plan{
		fixture.TestPlan(plan.IPv4, func(r *plan.Request) { r.ConditionsV4 = []string{"-s", "192.0.2.0/24"} }),
		fixture.TestPlan(plan.IPv4, nil),
	} {
		b, _ := memBackend()
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
		k := &recordingKernel{Kernel: b.Kernel}
		b.Kernel = k
		if rep, err := b.Sync([]*plan.Plan{p}, converge.Options{}); err != nil || rep.Results[0].State != converge.OK || tools(k) == 0 {
			t.Errorf("%v: %+v, %v, calls %q; want ok, judged by the tools", p.Conditions, rep, err, k.calls)
		}
	}
}

func restore(t *testing.T, m *xttest.Memory, payload string) {
	t.Helper()
	if err := m.Kernel(Table).Restore([]byte(payload)); err != nil {
		t.Fatal(err)
	}
}
