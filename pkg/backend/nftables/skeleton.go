package nftables

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

type baseChain struct {
	name string
	hook nft.BaseChain
}

// baseChains are the hooks of the skeleton; both jump to dispatch for
// packets to a local address.
var baseChains = []baseChain{
	{"prerouting", nft.BaseChain{Type: "nat", Hook: "prerouting", HookNum: unix.NF_INET_PRE_ROUTING, Priority: -100}}, // dstnat
	{"output", nft.BaseChain{Type: "nat", Hook: "output", HookNum: unix.NF_INET_LOCAL_OUT, Priority: -100}},
}

var (
	masqBase  = nft.BaseChain{Type: "nat", Hook: "postrouting", HookNum: unix.NF_INET_POST_ROUTING, Priority: 100} // srcnat
	guardBase = nft.BaseChain{Type: "filter", Hook: "input", HookNum: unix.NF_INET_LOCAL_IN}
)

// dispatchRules look up the dispatch maps, in order: a specific host IP
// before the wildcard; for each, the exact verdict map, the flat keys'
// hairpin sets of lengths and DNAT map (flat.go), the interval map.
func dispatchRules(lengths []int) []*nft.Rule {
	out := make([]*nft.Rule, 0, len(dispatchMaps)+2+2*len(lengths))
	for _, m := range dispatchMaps {
		out = append(out, &nft.Rule{Chain: DispatchChain, Stmts: []nft.Stmt{vmapLookup{set: m.name, addr: m.addr, interval: m.interval}}})
		if !m.interval {
			out = append(out, flatDispatchRules(m.addr, lengths)...)
		}
	}
	return out
}

// skeletonRules lists each shared chain with its exact rules for
// attachments that need n; lengths are the prefix lengths of the hairpin
// sets (flat.go).
func skeletonRules(n needs, lengths []int) map[string][]*nft.Rule {
	rules := map[string][]*nft.Rule{DispatchChain: dispatchRules(lengths)}
	for _, bc := range baseChains {
		rules[bc.name] = []*nft.Rule{{Chain: bc.name, Stmts: []nft.Stmt{nft.FibLocal{}, nft.Jump{To: DispatchChain}}}}
	}
	if n.masq {
		mark := plan.Masquerade{MarkBit: n.markBit}.Mark()
		masq, mk := masqChain(n.markBit), markChain(n.markBit)
		rules[masq] = []*nft.Rule{{Chain: masq, Stmts: []nft.Stmt{nft.MarkHas{Mark: mark}, nft.Masquerade{}}}}
		rules[mk] = []*nft.Rule{{Chain: mk, Stmts: []nft.Stmt{nft.MarkOr{Mark: mark}}}}
	}
	if n.localNet {
		rules[GuardChain] = []*nft.Rule{{Chain: GuardChain, Stmts: []nft.Stmt{guardDrop{}}}}
	}
	return rules
}

// addSkeleton writes the table, maps and shared chains attachments that
// need n rely on, idempotently (the chains flushed and refilled), with
// the hairpin sets of lengths (lengthsOf).
func addSkeleton(tx *nft.Tx, n needs, lengths []int) {
	tx.Add(&nft.Table{Comment: tableComment})
	for _, m := range dispatchMaps {
		tx.Add(m.set(tx.Family))
	}
	for _, m := range flatSets(tx.Family, lengths) {
		tx.Add(m)
	}
	rules := skeletonRules(n, lengths)
	tx.Add(&nft.Chain{Name: DispatchChain})
	if n.masq {
		tx.Add(&nft.Chain{Name: markChain(n.markBit)})
	}
	for _, bc := range baseChains {
		tx.Add(&nft.Chain{Name: bc.name, Base: &bc.hook})
	}
	if n.masq {
		tx.Add(&nft.Chain{Name: masqChain(n.markBit), Base: &masqBase})
	}
	if n.localNet {
		tx.Add(&nft.Chain{Name: GuardChain, Base: &guardBase})
	}
	for _, name := range skeletonOrder(rules) {
		tx.Flush(&nft.Chain{Name: name})
		for _, r := range rules[name] {
			tx.Add(r)
		}
	}
}

// skeletonOrder lists the shared chains of m in the order they are
// written: base chains, dispatch, guard, then the masquerade and mark
// chains of each bit in use.
func skeletonOrder[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for _, k := range []string{"prerouting", "output", DispatchChain, GuardChain} {
		if _, ok := m[k]; ok {
			out = append(out, k)
		}
	}
	for k := range m {
		if strings.HasPrefix(k, "masquerade-") {
			out = append(out, k)
		}
	}
	for k := range m {
		if strings.HasPrefix(k, "mark-") {
			out = append(out, k)
		}
	}
	return out
}

// AddScript is the nft script of ADD's fast path for p, and the number of
// commands it must hold (for tests and fuzzing of the rendering).
func AddScript(p *plan.Plan) (script string, commands int) {
	tx := layoutOf(p).create()
	return tx.Text(), tx.Len()
}

// flatSetNames are the names of the DNAT maps and the hairpin sets of
// lengths.
func flatSetNames(lengths []int) []string {
	out := []string{ownersMap, hostIPDNATMap, HostDNATMap}
	for _, l := range lengths {
		out = append(out, hairpinSet(true, l), hairpinSet(false, l))
	}
	return out
}

// skeletonSets are the maps and sets of the skeleton that attachments
// whose hairpin sets have lengths rely on.
func skeletonSets(lengths []int) []string {
	out := make([]string, 0, len(dispatchMaps)+3+2*len(lengths))
	for _, m := range dispatchMaps {
		out = append(out, m.name)
	}
	return append(out, flatSetNames(lengths)...)
}

// flatSets are the skeleton's owners map, DNAT maps and the hairpin sets
// of lengths.
func flatSets(f nft.Family, lengths []int) []*nft.Set {
	out := []*nft.Set{ownersSet(), dnatMapSet(f, hostIPDNATMap, true), dnatMapSet(f, HostDNATMap, false)}
	for _, addr := range []bool{true, false} {
		for _, l := range lengths {
			out = append(out, hairpinSetOf(f, addr, l))
		}
	}
	return out
}

// dnatMapSet declares a DNAT map: a key to an address and port.
func dnatMapSet(f nft.Family, name string, addr bool) *nft.Set {
	return &nft.Set{Name: name, Key: keyTypes(f, addr), Data: []nft.Type{f.AddrType(), nft.InetService}}
}

// flatDispatchRules are the dispatch chain's rules for flat keys of one
// host IP kind: the hairpin marks of each prefix length, then the DNAT.
func flatDispatchRules(addr bool, lengths []int) []*nft.Rule {
	dm := HostDNATMap
	if addr {
		dm = hostIPDNATMap
	}
	out := make([]*nft.Rule, 0, len(lengths)+1)
	for _, l := range lengths {
		out = append(out, &nft.Rule{Chain: DispatchChain, Stmts: []nft.Stmt{hairpinLookup{addr: addr, ones: l}, nft.MarkOr{Mark: 1 << flatMarkBit}}})
	}
	return append(out, &nft.Rule{Chain: DispatchChain, Stmts: []nft.Stmt{dnatLookup{set: dm, addr: addr}}})
}

// lengthsOf are the prefix lengths of the hairpin lookups chain c (the
// dispatch chain, as read) holds, and of ls' hairpin sets: the lengths
// the skeleton keeps, longest first.
func lengthsOf(c *ChainState, ls ...*layout) []int {
	seen := map[int]bool{}
	if c != nil {
		for _, r := range c.Rules {
			for _, lk := range r.Lookups() {
				if _, l, ok := hairpinLength(lk.Set); ok && !lk.Verdict && !lk.Data && !lk.Inv {
					seen[l] = true
				}
			}
		}
	}
	for _, l := range ls {
		for _, n := range l.lengths {
			seen[n] = true
		}
	}
	out := make([]int, 0, len(seen))
	for l := range seen {
		out = append(out, l)
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// hairpinSetOf declares the hairpin set of a host IP kind and prefix
// length: a source masked to it, and a key.
func hairpinSetOf(f nft.Family, addr bool, ones int) *nft.Set {
	return &nft.Set{Name: hairpinSet(addr, ones), Key: append([]nft.Type{f.AddrType()}, keyTypes(f, addr)...)}
}

// missingError is a shared object found missing; some says that others
// (a chain of the table) exist.
type missingError struct {
	what string
	some bool
}

func (e *missingError) Error() string { return e.what }

// skeletonChains are the shared chains attachments that need n rely on.
func skeletonChains(n needs) []string { return skeletonOrder(skeletonRules(n, nil)) }

// skeletonIn checks, in what st read, the shared chains attachments that
// need n rely on, with the dispatch chain's hairpin lookups of lengths (a
// missingError names the first gap).
func skeletonIn(f plan.Family, st *State, n needs, lengths []int) error {
	if gaps, some := skeletonGaps(f, n, lengths, st.Chains); len(gaps) > 0 {
		return &missingError{what: gaps[0], some: some}
	}
	return nil
}

// skeletonGaps is the judge of the skeleton (CHECK, STATUS, the pass,
// ADD's slow path): each missing chain of those attachments that need n
// rely on, and the first missing rule of each chain there (the dispatch
// chain with the hairpin lookups of lengths); some says one is there.
func skeletonGaps(f plan.Family, n needs, lengths []int, chains map[string]*ChainState) (gaps []string, some bool) {
	skel := skeletonRules(n, lengths)
	for _, name := range skeletonOrder(skel) {
		c := chains[name]
		if c == nil {
			gaps = append(gaps, fmt.Sprintf("missing chain %s in table %s %s", name, nftFamily(f), Table))
			continue
		}
		some = true
		for _, r := range skel[name] {
			if !hasRule(f, c, r) {
				gaps = append(gaps, fmt.Sprintf("missing rule %q in chain %s", r.StmtText(nft.Family(f)), name))
				break
			}
		}
	}
	return gaps, some
}

// hasRule reports whether chain c holds a rule doing what the shared
// rule r does.
func hasRule(f plan.Family, c *ChainState, r *nft.Rule) bool {
	want := r.AsRead(nft.Family(f))
	return slices.ContainsFunc(c.Rules, func(got RuleState) bool { return got.Lacks(nft.Family(f), want) == "" })
}
