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
	"github.com/portmap-dev/portmap/pkg/converge"
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
// forwardAccept layer is the real one over x_tables' filter table in
// memory too (iptables' Ruleset shows it); the localhost layer stays a
// recording fake.
func BackendsInMemory(h *host.Host) map[backend.Name]InMemory {
	k := nfttest.New()
	xs := map[plan.Family]*xttest.Memory{}
	for _, f := range plan.Families {
		xs[f] = xttest.New(xt.NativeExprs)
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
	for i, l := range h.Layers {
		if l.Name == "forwardAccept" {
			h.Layers[i].Open = func(f plan.Family, _ io.Writer, _ *plan.Request) (backend.Backend, error) {
				return &iptables.Accept{Family: f, Kernel: xs[f].Kernel(iptables.FilterTable), Lock: func() (func(), error) { return func() {}, nil }}, nil
			}
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

// NewInMemory is New with the backends and the forwardAccept layer over
// kernels in memory (BackendsInMemory), each behind the recorder's knobs
// (FailOpen, FailApply, FailAll, FailReady, FailSync) and its call log:
// a test judges a verb by what the kernels, the ledger, route_localnet
// and the conntrack flushes hold afterwards.
func NewInMemory() (*host.Host, *Host, map[backend.Name]InMemory) {
	h, fh := New()
	mem := BackendsInMemory(h)
	for i, k := range h.Kinds {
		name, open := string(k.Name), k.Open
		h.Kinds[i].Open = func(f plan.Family, w io.Writer) (backend.Backend, error) {
			return fh.knobbed("backend "+name, name, f, func() (backend.Backend, error) { return open(f, w) })
		}
	}
	for i, l := range h.Layers {
		if l.Name != "forwardAccept" {
			continue
		}
		name, open := l.Name, l.Open
		h.Layers[i].Open = func(f plan.Family, w io.Writer, r *plan.Request) (backend.Backend, error) {
			return fh.knobbed("layer "+name, name, f, func() (backend.Backend, error) { return open(f, w, r) })
		}
	}
	return h, fh, mem
}

func (h *Host) knobbed(call, name string, f plan.Family, open func() (backend.Backend, error)) (backend.Backend, error) {
	h.Record(call + " " + f.String())
	if err := h.FailOpen[name]; err != nil {
		return nil, err
	}
	b, err := open()
	if err != nil {
		return nil, err
	}
	return knobs{b, h, f, name}, nil
}

// knobs is a real backend behind the recorder's knobs: a call fails as
// they say before it reaches the backend, and is recorded as the
// recording fakes record it.
type knobs struct {
	backend.Backend
	h    *Host
	f    plan.Family
	name string
}

func (k knobs) fail(op string, p *plan.Plan, err error) error {
	if p != nil {
		k.h.Record(describe(op, p))
	}
	if k.h.FailAll != nil {
		return k.h.FailAll
	}
	return err
}

func (k knobs) Apply(p *plan.Plan) error {
	if err := k.fail("apply", p, k.h.FailApply[k.name+" "+k.f.String()]); err != nil {
		return err
	}
	return k.Backend.Apply(p)
}

func (k knobs) Remove(p *plan.Plan) error {
	if err := k.fail("remove", p, nil); err != nil {
		return err
	}
	return k.Backend.Remove(p)
}

func (k knobs) Check(p *plan.Plan) error {
	if err := k.fail("check", p, nil); err != nil {
		return err
	}
	return k.Backend.Check(p)
}

func (k knobs) GC(network string, valid []plan.Owner) error {
	if err := k.fail("gc", nil, nil); err != nil {
		return err
	}
	return k.Backend.GC(network, valid)
}

func (k knobs) Ready(p *plan.Plan) error {
	if err := k.fail("ready", nil, k.h.FailReady); err != nil {
		return err
	}
	return k.Backend.Ready(p)
}

func (k knobs) Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error) {
	if err := k.fail("sync", nil, k.h.FailSync[k.name+" "+k.f.String()]); err != nil {
		return nil, err
	}
	return k.Backend.Sync(want, o)
}

func (k knobs) Skeleton(p *plan.Plan) (string, bool, error) {
	if err := k.fail("skeleton", nil, nil); err != nil {
		return "", false, err
	}
	if s, ok := k.Backend.(backend.Skeletal); ok {
		return s.Skeleton(p)
	}
	return "", true, nil
}
