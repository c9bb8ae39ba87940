package nftables

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Sync brings this family's cni_portmap table to the wanted plans (oldest
// first) for `portmap sync`: one listing of the table judges the skeleton
// and every attachment (its chain's rules and the map elements of the keys
// it wins: the newest plan of a key wins), and one transaction re-applies
// what is missing or wrong and, with Prune, removes orphans — dn- chains
// no wanted plan names, with the elements that point at them, and the
// upstream plugin's cni_hostport rules of containers no wanted plan
// names. Attachments that are right are not touched, so a pass after a
// pass writes nothing. The caller holds the host-wide lock.
func (b *Backend) Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error) {
	rep := converge.NewReport(len(want))
	fam := nftFamily(b.Family)
	st, err := b.Kernel.Table(b.Family, Table)
	if err != nil {
		return nil, fmt.Errorf("read table: %w", err)
	}
	up, err := b.Kernel.Table(b.Family, UpstreamTable)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", UpstreamTable, err)
	}
	exists := st != nil
	if st == nil {
		st = &State{Chains: map[string]*ChainState{}, Maps: map[string]bool{}, Holders: map[string]string{}}
	}

	// the newest plan of each port wins it, the ports of an interval
	// one by one
	winner := converge.Winners(want, portIDs)
	anyRanges := false
	for _, p := range want {
		anyRanges = anyRanges || hasRanges(p)
	}
	var all []Element
	var served *view
	if anyRanges {
		all = elementsOfState(st)
		served = newView(all, func(Key) bool { return true })
	}

	// The skeleton every wanted plan relies on.
	var shared []string
	kinds := map[string]*plan.Plan{}
	for _, p := range want {
		kinds[fmt.Sprintf("%v/%d/%v", marksOwnBit(p), p.Masquerade.MarkBit, p.LocalNet())] = p
	}
	switch {
	case len(want) == 0:
	case !exists:
		shared = append(shared, fmt.Sprintf("table %s %s missing", fam, Table))
	default:
		for _, m := range dispatchMaps {
			if !st.Maps[m.name] && (anyRanges || !m.interval) {
				shared = append(shared, "map "+m.name+" missing")
			}
		}
		for _, k := range sortedStrings(kinds) {
			skel := skeletonRules(kinds[k])
			for _, c := range skeletonOrder(skel) {
				cs, ok := st.Chains[c]
				if !ok {
					if !slices.Contains(shared, "chain "+c+" missing") {
						shared = append(shared, "chain "+c+" missing")
					}
					continue
				}
				for _, r := range skel[c] {
					if !hasRule(cs, r) && !contains(shared, "chain "+c) && (anyRanges || !rangesLookup(r)) {
						shared = append(shared, fmt.Sprintf("chain %s: rule %q missing", c, r.Text(b.Family)))
					}
				}
			}
		}
	}
	rep.Shared = shared

	broken := map[int]bool{}
	whys := converge.Judge(len(want), func(i int) string { return judge(want[i], st, served, winner, i) })
	for i, why := range whys {
		if why != "" {
			broken[i] = true
			rep.Results[i] = converge.Result{State: converge.Repaired, What: why}
		}
	}

	wanted, wantedIDs := map[string]bool{}, map[string]bool{}
	for _, p := range want {
		wanted[ChainName(p.Owner)] = true
		wantedIDs[p.Owner.ContainerID] = true
	}
	orphanChains := map[string]bool{}
	for _, name := range sortedChains(st) {
		if !strings.HasPrefix(name, "dn-") || wanted[name] {
			continue
		}
		network, id, _ := st.Chains[name].owner()
		if rep.AddOrphan(o, network, id, "chain "+name) {
			orphanChains[name] = true
		}
	}
	upRules := upstreamRules(up)
	upIDs := map[string]bool{}
	for _, id := range sortedStrings(upRules) {
		// upstream's rules name the container only
		if !wantedIDs[id] && rep.AddOrphan(o, "", id, fmt.Sprintf("%d rules in table %s", upRules[id], UpstreamTable)) {
			upIDs[id] = true
		}
	}

	prune := o.Prune && len(rep.Orphans) > 0
	if o.DryRun || (len(broken) == 0 && len(shared) == 0 && !prune) {
		return rep, nil
	}

	tx := newTx(b.Family)
	if len(shared) > 0 || (len(broken) > 0 && !exists) {
		for _, k := range sortedStrings(kinds) {
			addSkeleton(tx, kinds[k])
		}
	}
	// Element changes are computed as a whole, so that a key is deleted
	// or added once even when a repair and a prune both touch it.
	desired := map[string]string{}
	for i, p := range want {
		if !broken[i] {
			continue
		}
		chain := rewriteChain(tx, p)
		mine := map[string]bool{}
		for _, k := range Keys(p) {
			if !k.IsRange() {
				mine[k.ID()] = true
				if winner[k.ID()] == i {
					desired[k.ID()] = chain.name
				}
				continue
			}
			// the pieces of the interval the plan wins; an element of
			// one port that would shadow a won port goes
			for _, piece := range wonPieces(k, winner, i) {
				mine[piece.ID()] = true
				desired[piece.ID()] = chain.name
				for port := piece.Port; port <= piece.last(); port++ {
					one := Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: port}.ID()
					if h := st.Holders[one]; h != "" && h != chain.name {
						desired[one] = ""
					}
				}
			}
		}
		for id, h := range st.Holders {
			if h == chain.name && !mine[id] {
				if _, set := desired[id]; !set {
					desired[id] = ""
				}
			}
		}
	}
	cutIntervals(st, all, desired)
	if prune {
		for id, h := range st.Holders {
			if _, set := desired[id]; orphanChains[h] && !set {
				desired[id] = ""
			}
		}
	}
	// deletions first: the kernel checks an interval against the
	// elements the transaction leaves
	for _, deleting := range []bool{true, false} {
		for _, id := range sortedStrings(desired) {
			k, ok := keyFromID(id)
			cur, want := st.Holders[id], desired[id]
			if !ok || cur == want {
				continue
			}
			if deleting && cur != "" {
				tx.add(opDelete, elemObj{key: k})
			}
			if !deleting && want != "" {
				tx.add(opAdd, elemObj{k, want})
			}
		}
	}
	if prune {
		for _, name := range sortedChains(st) {
			if orphanChains[name] {
				tx.add(opFlush, chainObj{name: name})
				tx.add(opDelete, chainObj{name: name})
			}
		}
	}
	var txs []*Tx
	if tx.Len() > 0 {
		txs = append(txs, tx)
	}
	if prune {
		if utx := upstreamTx(b.Family, up, upIDs); utx.Len() > 0 {
			txs = append(txs, utx)
		}
	}
	for _, t := range txs {
		if err := b.Kernel.Apply(t); err != nil {
			err = fmt.Errorf("sync: %w", err)
			rep.WriteFailed(broken, prune, err)
			return rep, nil
		}
	}
	if len(txs) == 0 {
		return rep, nil
	}
	rep.WriteDone(prune)
	return rep, nil
}

// judge says what of plan i the table shows missing or wrong, or "".
// served is the table's elements (when a wanted plan has intervals).
func judge(p *plan.Plan, st *State, served *view, winner map[string]int, i int) string {
	own := ChainName(p.Owner)
	c, ok := st.Chains[own]
	if !ok {
		return "chain " + own + " missing"
	}
	if why := judgeChain(p, c); why != "" {
		return "chain " + own + ": " + why
	}
	for _, k := range Keys(p) {
		if k.IsRange() {
			c := classOf(k)
			for port := k.Port; port <= k.Last; port++ {
				one := Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: port}
				if winner[one.ID()] != i {
					continue
				}
				if e, ok := served.at(c, port); !ok {
					return fmt.Sprintf("map %s has no element for %s", k.Map(), one)
				} else if e.Chain != own {
					return fmt.Sprintf("map %s sends %s to %s, not to %s", e.Key.Map(), one, e.Chain, own)
				}
			}
			continue
		}
		if winner[k.ID()] != i {
			continue // a newer attachment holds it
		}
		if h := st.Holders[k.ID()]; h != own {
			if h == "" {
				return fmt.Sprintf("map %s has no element %s", k.Map(), k)
			}
			return fmt.Sprintf("map %s sends %s to %s, not to %s", k.Map(), k, h, own)
		}
	}
	return ""
}

// portIDs are the IDs a plan's ports are won by: its keys of one port,
// and each port of its intervals as a key of one port.
func portIDs(p *plan.Plan) []string {
	var ids []string
	for _, k := range Keys(p) {
		for port := k.Port; port <= k.last(); port++ {
			ids = append(ids, Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: port}.ID())
		}
	}
	return ids
}

// wonPieces are the stretches of interval k's ports plan i wins, as keys.
func wonPieces(k Key, winner map[string]int, i int) []Key {
	var out []Key
	start := -1
	for port := k.Port; port <= k.Last+1; port++ {
		won := port <= k.Last && winner[Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: port}.ID()] == i
		switch {
		case won && start < 0:
			start = port
		case !won && start >= 0:
			piece := Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: start}
			if port-1 > start {
				piece.Last = port - 1
			}
			out = append(out, piece)
			start = -1
		}
	}
	return out
}

// cutIntervals makes room for the intervals desired adds: an interval
// element of another chain sharing ports with one goes, and what is left
// of it is added back for its owner (unless desired says otherwise).
func cutIntervals(st *State, all []Element, desired map[string]string) {
	var adding []Key
	for id, to := range desired {
		if k, ok := keyFromID(id); ok && k.IsRange() && to != "" && st.Holders[id] != to {
			adding = append(adding, k)
		}
	}
	if len(adding) == 0 {
		return
	}
	for _, e := range all {
		if !e.Key.IsRange() || !overlapsAny(e.Key, adding) {
			continue
		}
		if _, set := desired[e.Key.ID()]; set {
			continue
		}
		desired[e.Key.ID()] = ""
		for _, piece := range subtract(e.Key, adding) {
			if _, set := desired[piece.ID()]; !set && st.Holders[piece.ID()] == "" {
				desired[piece.ID()] = e.Chain
			}
		}
	}
}

// elementsOfState lists the elements of a table read whole.
func elementsOfState(st *State) []Element {
	out := make([]Element, 0, len(st.Holders))
	for _, id := range sortedStrings(st.Holders) {
		if k, ok := keyFromID(id); ok {
			out = append(out, Element{k, st.Holders[id]})
		}
	}
	return out
}

// upstreamRules counts the upstream plugin's cni_hostport rules by the
// container ID of their comment.
func upstreamRules(up *State) map[string]int {
	rules := map[string]int{}
	if up == nil {
		return rules
	}
	for _, c := range up.Chains {
		for _, r := range c.Rules {
			if r.Comment != "" {
				rules[r.Comment]++
			}
		}
	}
	return rules
}

func contains(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func sortedIDs(m map[string]string) []string { return sortedStrings(m) }

func sortedStrings[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
