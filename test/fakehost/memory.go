package fakehost

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/pkg/xt/xttest"
)

// InMemory is a real backend over its kernel in memory, as a test
// drives it.
type InMemory struct {
	// Open is the backend of a family over that kernel: a test reads
	// what it holds with it (Mappings).
	Open func(f plan.Family) backend.Backend
	// Flush is a firewall's flush: every rule and chain gone.
	Flush func()
	// Refuse makes the kernel refuse writes with err; nil, take them.
	Refuse func(err error)
	// Trace is what the kernel does to a packet of family f, by the
	// tracer of its kernel in memory: its DNAT and masquerade (Chain
	// stays empty). local says which addresses are the host's.
	Trace func(f plan.Family, p plan.Packet, local func(net.IP) bool) (plan.Verdict, error)
	// Ruleset prints what the kernel holds, both families: a whole-state
	// picture a test compares before and after a sequence.
	Ruleset func() string
	// Stacks says a port's rules stack (iptables): a newer attachment's
	// go above an older one's, which stay, so the older passes CHECK and
	// has the port again once the newer goes. Else (nftables) the newer
	// takes the port's one map element.
	Stacks bool
}

// BackendsInMemory makes h's nftables and iptables backends the real
// ones over kernels in memory — nf_tables, both families in one; x_tables
// one per family, as iptables and ip6tables are — and returns them by
// name: the plugin's verbs and the agent's passes then write and read
// rules as on a node, and a test asserts on what a read shows. The
// layers stay recording fakes.
func BackendsInMemory(h *host.Host) map[backend.Name]InMemory {
	k := nfttest.New()
	xs := map[plan.Family]*xttest.Memory{}
	for _, f := range plan.Families {
		xs[f] = xttest.New(iptables.NativeExprs)
	}
	nfts := func(f plan.Family) backend.Backend { return nftables.NewOn(f, io.Discard, k) }
	ipt := func(f plan.Family) backend.Backend {
		return &iptables.Backend{Family: f, Kernel: xs[f].Kernel(iptables.Table), Lock: func() (func(), error) { return func() {}, nil }}
	}
	for i, kind := range h.Kinds {
		switch kind.Name {
		case backend.NFTables:
			h.Kinds[i].Open = func(f plan.Family, _ io.Writer) (backend.Backend, error) { return nfts(f), nil }
		case backend.IPTables:
			h.Kinds[i].Open = func(f plan.Family, _ io.Writer) (backend.Backend, error) { return ipt(f), nil }
		}
	}
	return map[backend.Name]InMemory{
		backend.NFTables: {Open: nfts, Flush: k.Flush, Refuse: func(err error) { k.NotWritable = err }, Ruleset: k.Ruleset,
			Trace: func(f plan.Family, p plan.Packet, local func(net.IP) bool) (plan.Verdict, error) {
				v, err := k.Trace(nfttest.Packet{Family: nft.Family(f), Proto: string(p.Protocol), Src: p.Src, Dst: p.Dst, Dport: p.Dport, Output: p.FromHost}, local)
				return plan.Verdict{DNAT: v.DNAT, Masquerade: v.Masquerade}, err
			}},
		backend.IPTables: {Open: ipt, Stacks: true,
			Ruleset: func() string {
				var b strings.Builder
				for _, f := range plan.Families {
					for _, table := range []string{xt.NAT, xt.Filter} {
						lines, _ := xs[f].Kernel(table).ListTable()
						// the chains by name: the order they were made in
						// is not state
						chains := slices.DeleteFunc(slices.Clone(lines), func(l string) bool { return !strings.HasPrefix(l, "-N ") })
						slices.Sort(chains)
						lines = slices.DeleteFunc(lines, func(l string) bool { return strings.HasPrefix(l, "-N ") })
						fmt.Fprintf(&b, "%s %s\n%s\n%s\n", f, table, strings.Join(chains, "\n"), strings.Join(lines, "\n"))
					}
				}
				return b.String()
			},
			Trace: func(f plan.Family, p plan.Packet, local func(net.IP) bool) (plan.Verdict, error) {
				v, err := xs[f].Trace(p, local)
				return plan.Verdict{DNAT: v.DNAT, Masquerade: v.Masquerade}, err
			},
			Flush: func() {
				for _, x := range xs {
					x.Flush()
				}
			},
			Refuse: func(err error) {
				for _, x := range xs {
					x.NotWritable = err
				}
			}},
	}
}

// Mapped is what a read of the kernel shows forwarded, both families:
// each mapping as line spells it, sorted, each line once.
func (m InMemory) Mapped(t testing.TB, line func(plan.Installed) string) []string {
	t.Helper()
	var out []string
	for _, f := range plan.Families {
		ms, err := m.Open(f).Mappings()
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range ms {
			out = append(out, line(i))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
