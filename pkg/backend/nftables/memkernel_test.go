package nftables

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Memory is the backend's kernel over nf_tables in memory
// (nfttest.Kernel), for tests without root: the same netlink messages,
// reads and decoders as on a node, only the socket is not one. A
// transaction holding conditions (nft syntax, which only nft compiles)
// is applied without them, as if they matched. Trace follows a packet
// through what a read of the table tells.
type Memory struct {
	*netlinkKernel
	nf *nfttest.Kernel
}

var _ Kernel = (*Memory)(nil)

// NewMemory returns an empty nf_tables.
func NewMemory() *Memory {
	nf := nfttest.New()
	return &Memory{netlinkKernel: NewOn(plan.IPv4, nil, nf).Kernel.(*netlinkKernel), nf: nf}
}

// chain reads one chain of the IPv4 table with its rules; nil when it
// is absent or the read fails.
func (m *Memory) chain(name string) *ChainState {
	st, err := m.Read(plan.IPv4, Query{Chains: []string{name}})
	if err != nil {
		return nil
	}
	return st.Chains[name]
}

// elements reads the IPv4 table's elements of keys (Query.Keys), in key
// order.
func (m *Memory) elements(keys ...Key) ([]Element, error) {
	st, err := m.Read(plan.IPv4, Query{Keys: keys})
	if err != nil {
		return nil, err
	}
	return elementsOfState(st), nil
}

// FlushRuleset empties this in-memory kernel, as `nft flush ruleset`
// would the real one: every table gone. It touches no host state.
func (m *Memory) FlushRuleset() { m.nf.Flush() }

// Committed counts the transactions applied; Refused those the kernel
// refused; Listed the elements of the maps read whole.
func (m *Memory) Committed() int { return m.nf.Commits }
func (m *Memory) Refused() int   { return m.nf.Refused }
func (m *Memory) Listed() int    { return m.nf.Listed }

// Dump prints both families' tables as a read of each tells them, one
// object a line: a whole-state picture tests compare before and after a
// sequence.
func (m *Memory) Dump() string {
	var b strings.Builder
	for _, f := range plan.Families {
		for _, table := range []string{Table, upstreamTable} {
			st, err := m.Table(f, table)
			if err != nil {
				fmt.Fprintf(&b, "table %s %s: %v\n", nftFamily(f), table, err)
				continue
			}
			if st == nil {
				continue
			}
			fmt.Fprintf(&b, "table %s %s\n", nftFamily(f), table)
			for _, n := range slices.Sorted(maps.Keys(st.Chains)) {
				c := st.Chains[n]
				fmt.Fprintf(&b, "  chain %s %q", n, c.Comment)
				if c.Owned {
					b.WriteString(" owned")
				}
				if c.HasClaims {
					fmt.Fprintf(&b, " record %v", c.Claims)
				}
				b.WriteByte('\n')
				for _, r := range c.Rules {
					b.WriteString("    " + r.StmtText(nft.Family(f)))
					if r.Comment != "" {
						fmt.Fprintf(&b, " comment %q", r.Comment)
					}
					if len(r.DNATs) > 0 {
						fmt.Fprintf(&b, " map %v", r.DNATs)
					}
					b.WriteByte('\n')
				}
			}
			for _, n := range slices.Sorted(maps.Keys(st.Maps)) {
				fmt.Fprintf(&b, "  set %s\n", n)
			}
			for _, k := range slices.SortedFunc(maps.Keys(st.Elements), compareKeys) {
				fmt.Fprintf(&b, "  element %s %v\n", k.Map(), st.Elements[k])
			}
			hps := make([]string, 0, len(st.Hairpins))
			for _, h := range st.Hairpins {
				hps = append(hps, h.String()+" comment "+h.Chain)
			}
			sort.Strings(hps)
			for _, h := range hps {
				fmt.Fprintf(&b, "  hairpin %s\n", h)
			}
		}
	}
	return b.String()
}
