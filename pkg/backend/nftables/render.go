package nftables

import (
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

// skeletonRules lists each shared chain with its exact rules; lengths are
// the prefix lengths of the hairpin sets (flat.go).
func skeletonRules(p *plan.Plan, lengths []int) map[string][]*nft.Rule {
	rules := map[string][]*nft.Rule{DispatchChain: dispatchRules(lengths)}
	for _, bc := range baseChains {
		rules[bc.name] = []*nft.Rule{{Chain: bc.name, Stmts: []nft.Stmt{nft.FibLocal{}, nft.Jump{To: DispatchChain}}}}
	}
	if marksOwnBit(p) {
		mark := p.Masquerade.Mark()
		masq, mk := masqChain(p.Masquerade.MarkBit), markChain(p.Masquerade.MarkBit)
		rules[masq] = []*nft.Rule{{Chain: masq, Stmts: []nft.Stmt{nft.MarkHas{Mark: mark}, nft.Masquerade{}}}}
		rules[mk] = []*nft.Rule{{Chain: mk, Stmts: []nft.Stmt{nft.MarkOr{Mark: mark}}}}
	}
	if p.LocalNet() {
		rules[GuardChain] = []*nft.Rule{{Chain: GuardChain, Stmts: []nft.Stmt{guardDrop{}}}}
	}
	return rules
}

// marksOwnBit reports whether p needs this table's mark-bitN and
// masquerade-bitN chains (nftables has no external mark chain).
func marksOwnBit(p *plan.Plan) bool { return p.Masquerade.Enabled }

// addSkeleton writes the table, maps and shared chains, idempotently: the
// shared chains are flushed and refilled with their fixed rules, which also
// repairs them. lengths are the hairpin sets' prefix lengths: those the
// node has (lengthsOf) and p's.
func addSkeleton(tx *nft.Tx, p *plan.Plan, lengths []int) {
	tx.Add(&nft.Table{Comment: tableComment})
	for _, m := range dispatchMaps {
		tx.Add(m.set(tx.Family))
	}
	for _, m := range flatSets(tx.Family, lengths) {
		tx.Add(m)
	}
	rules := skeletonRules(p, lengths)
	tx.Add(&nft.Chain{Name: DispatchChain})
	if marksOwnBit(p) {
		tx.Add(&nft.Chain{Name: markChain(p.Masquerade.MarkBit)})
	}
	for _, bc := range baseChains {
		tx.Add(&nft.Chain{Name: bc.name, Base: &bc.hook})
	}
	if marksOwnBit(p) {
		tx.Add(&nft.Chain{Name: masqChain(p.Masquerade.MarkBit), Base: &masqBase})
	}
	if p.LocalNet() {
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

// chainRules are the rules of the attachment's chain. The chain is
// entered only through the map elements of the attachment's own keys, so
// what holds for all of them is said once: mark hairpin and (IPv4)
// localhost connections for masquerading, with no port match. Then DNAT,
// one rule per run of mappings (plan.Runs): a single mapping, or a range
// whose host and container ports are the same (`th dport 20000-20999
// dnat to 192.0.2.2`, the port kept); a range with an offset becomes one
// rule per port, as nft has no shifted port range. From mapMin single
// mappings of one host IP kind (wildcard, or specific), their DNAT is
// one rule looking them up in a map of its own (dnatMap), before the
// ranges' rules, as the dispatch finds a port before an interval. The
// conditions lead every rule. A "hostport" comment names the keys of its
// rule; a map's rule is commented "hostports" (mapComment) and its keys
// are its map's.
func chainRules(p *plan.Plan) []*nft.Rule { return layoutRules(p, mapMin) }

// mapMin is the number of single mappings of one host IP kind from which
// their DNAT is one rule and a map: below it, a rule each costs the
// kernel less than a map, and reads as the mappings do in nft's listing.
const mapMin = 8

// mapComment comments the DNAT map rule of a host IP kind.
func mapComment(addr bool) string {
	if addr {
		return "hostports by address"
	}
	return "hostports"
}

// layoutRules are the chain's rules with DNAT maps from `from` single
// mappings of a kind; with from 0, none (the layout before maps).
func layoutRules(p *plan.Plan, from int) []*nft.Rule {
	chain := ChainName(p.Owner)
	var cond []nft.Stmt
	if len(p.Conditions) > 0 {
		cond = []nft.Stmt{nft.Conditions{Nft: strings.Join(p.Conditions, " ")}}
	}
	with := func(more ...nft.Stmt) []nft.Stmt { return append(append([]nft.Stmt(nil), cond...), more...) }
	var rules []*nft.Rule
	if p.Masquerade.Enabled && !p.Empty() {
		setMark := nft.Jump{To: markChain(p.Masquerade.MarkBit)}
		rules = append(rules, &nft.Rule{Chain: chain, Comment: hairpinRule,
			Stmts: with(nft.Addr{Spec: p.HairpinSource()}, setMark)})
		if p.LocalhostRule() {
			rules = append(rules, &nft.Rule{Chain: chain, Comment: localhostRule,
				Stmts: with(nft.Addr{Spec: "127.0.0.1"}, setMark)})
		}
	}
	runs := dnatRuns(p.Runs())
	mapped := [2]bool{} // by kind: wildcard, specific host IP
	if from > 0 {
		var n [2]int
		for _, r := range runs {
			if r.Len == 1 {
				n[kindOf(r)]++
			}
		}
		for kind := range n {
			if n[kind] < from {
				continue
			}
			mapped[kind] = true
			m := dnatMap{addr: kind == 1, to: p.ContainerNet.IP, entries: make([]mapEntry, 0, n[kind])}
			for _, r := range runs {
				if r.Len == 1 && kindOf(r) == kind {
					m.entries = append(m.entries, mapEntry{runKey(r), r.ContainerPort})
				}
			}
			rules = append(rules, &nft.Rule{Chain: chain, Comment: mapComment(m.addr), Stmts: with(m)})
		}
	}
	rules = slices.Grow(rules, len(runs))
	for _, run := range runs {
		if run.Len == 1 && mapped[kindOf(run)] {
			continue
		}
		stmts := make([]nft.Stmt, 0, len(cond)+4)
		stmts = append(append(stmts, cond...), nft.L4Proto{Name: string(run.Protocol)}, nft.DPort{Port: run.HostPort, Last: run.Last()})
		if run.HostIP != nil {
			stmts = append(stmts, nft.Addr{Dst: true, Spec: run.HostIP.String()})
		}
		target := nft.DNAT{IP: p.ContainerNet.IP, Port: run.ContainerPort}
		if run.Len > 1 {
			target.Port = 0 // an identity range: the port stays
		}
		rules = append(rules, &nft.Rule{Chain: chain, Comment: keyComment + runKeys(run),
			Stmts: append(stmts, target)})
	}
	return rules
}

// runKeys spells the keys of a run as a "hostport" comment holds them:
// its key (Key.String), "tcp . 8080" or "tcp . 20000-20999".
func runKeys(r plan.Run) string { return runKey(r).String() }

// rewriteChain makes the attachment's chain hold exactly its rules —
// none for a flat attachment, whose claim rules it writes — whether it
// exists or not (the slow path, sync's repair), and returns it. c is
// the chain as read (nil: absent).
func rewriteChain(tx *nft.Tx, p *plan.Plan, c *ChainState) *nft.Chain {
	chain := ownChain(p)
	tx.Add(chain)
	tx.Flush(chain)
	if isFlat(p) {
		writeClaims(tx, chain.Name, Keys(p))
		return chain
	}
	dropClaims(tx, chain.Name, c)
	for _, r := range chainRules(p) {
		tx.Add(r)
	}
	return chain
}

// fastAddTx is ADD's fast path: create the attachment's chain (failing if
// it exists), fill it, and add its map elements (failing if another
// attachment holds a key, or the maps are missing).
func fastAddTx(p *plan.Plan) *nft.Tx {
	tx := newTx(p.Family)
	rules, keys := chainRules(p), Keys(p)
	for i := range keys {
		keys[i].Flat = false // a chain's: reached through the verdict maps
	}
	tx.Grow(1 + len(rules) + len(keys))
	chain := newChain(tx, p, rules)
	for _, k := range keys {
		tx.Add(elemObj{key: k, chain: chain.Name})
	}
	return tx
}

// newChain creates the attachment's chain, failing if it exists, with
// its rules, and returns it.
func newChain(tx *nft.Tx, p *plan.Plan, rules []*nft.Rule) *nft.Chain {
	chain := ownChain(p)
	tx.Create(chain)
	for _, r := range rules {
		tx.Add(r)
	}
	return chain
}

// AddScript is the nft script of ADD's fast path for p, and the number of
// commands it must hold (for tests and fuzzing of the rendering).
func AddScript(p *plan.Plan) (script string, commands int) {
	tx := fastAddTx(p)
	return tx.Text(), tx.Len()
}
