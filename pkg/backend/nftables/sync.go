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
	return converge.Run(len(want), o, converge.Pass[*syncState, orphan]{
		Read:   func() (*syncState, error) { return b.readSync(want) },
		Decide: func(s *syncState) converge.Verdict[orphan] { return s.decide() },
		Write:  b.writeSync,
	})
}

// syncState is the family's tables as a pass read them, and what the
// wanted plans make of them.
type syncState struct {
	family plan.Family
	want   []*plan.Plan
	st, up *State // the table (empty when absent) and upstream's
	exists bool
	// winner is the newest plan of each port (of an interval, port by
	// port); all and served are the table's elements, read only when a
	// wanted plan has intervals.
	winner    map[string]int
	anyRanges bool
	all       []Element
	served    *view
	// kinds are the wanted plans by the skeleton they need; anyFlat says
	// a flat attachment is there, whose hairpin sets' prefix lengths are
	// flatLengths; hairpins indexes the table's hairpin elements by ID.
	kinds       map[string]*plan.Plan
	anyFlat     bool
	flatLengths []int
	hairpins    map[string]Hairpin
}

// orphan is what a pass removes of an orphan: a dn- chain of ours, or the
// upstream plugin's rules of a container.
type orphan struct {
	chain, upstreamID string
}

func (b *Backend) readSync(want []*plan.Plan) (*syncState, error) {
	st, err := b.Kernel.Table(b.Family, Table)
	if err != nil {
		return nil, fmt.Errorf("read table: %w", err)
	}
	up, err := b.Kernel.Table(b.Family, UpstreamTable)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", UpstreamTable, err)
	}
	s := &syncState{family: b.Family, want: want, st: st, up: up, exists: st != nil,
		winner: converge.Winners(want, portIDs), kinds: map[string]*plan.Plan{}}
	if st == nil {
		s.st = newState()
	}
	s.hairpins = make(map[string]Hairpin, len(s.st.Hairpins))
	for _, h := range s.st.Hairpins {
		s.hairpins[h.ID()] = h
	}
	var flat []*plan.Plan
	for _, p := range want {
		s.anyRanges = s.anyRanges || hasRanges(p)
		// the skeleton's flat parts are needed once a flat attachment is
		// there
		if isFlat(p) {
			s.anyFlat = true
			flat = append(flat, p)
		}
		s.kinds[fmt.Sprintf("%v/%d/%v", marksOwnBit(p), p.Masquerade.MarkBit, p.LocalNet())] = p
	}
	s.flatLengths = lengthsOf(nil, flat...)
	if s.anyRanges {
		s.all = elementsOfState(s.st)
		s.served = newView(s.all, func(Key) bool { return true })
	}
	return s, nil
}

// decide judges the skeleton, every wanted plan and the orphans.
func (s *syncState) decide() converge.Verdict[orphan] {
	v := converge.Verdict[orphan]{Shared: s.skeleton(),
		Whys: converge.Judge(len(s.want), func(i int) string { return s.judge(i) })}
	wanted, wantedIDs := map[string]bool{}, map[string]bool{}
	for _, p := range s.want {
		wanted[ChainName(p.Owner)] = true
		wantedIDs[p.Owner.ContainerID] = true
	}
	for _, name := range sortedChains(s.st) {
		if strings.HasPrefix(name, "dn-") && !wanted[name] {
			network, id, _ := s.st.Chains[name].owner()
			v.Candidates = append(v.Candidates, converge.Candidate[orphan]{Network: network, ContainerID: id,
				Object: "chain " + name, Handle: orphan{chain: name}})
		}
	}
	upRules := upstreamRules(s.up)
	for _, id := range sortedStrings(upRules) {
		if !wantedIDs[id] { // upstream's rules name the container only
			v.Candidates = append(v.Candidates, converge.Candidate[orphan]{ContainerID: id,
				Object: fmt.Sprintf("%d rules in table %s", upRules[id], UpstreamTable), Handle: orphan{upstreamID: id}})
		}
	}
	return v
}

// skeleton names what every wanted plan relies on and the table lacks.
func (s *syncState) skeleton() []string {
	if len(s.want) == 0 {
		return nil
	}
	if !s.exists {
		return []string{fmt.Sprintf("table %s %s missing", nftFamily(s.family), Table)}
	}
	var shared []string
	for _, m := range dispatchMaps {
		if !s.st.Maps[m.name] && (s.anyRanges || !m.interval) {
			shared = append(shared, "map "+m.name+" missing")
		}
	}
	if s.anyFlat {
		for _, name := range flatSetNames(s.flatLengths) {
			if !s.st.Maps[name] {
				shared = append(shared, "map "+name+" missing")
			}
		}
	}
	for _, k := range sortedStrings(s.kinds) {
		skel := skeletonRules(s.kinds[k], s.flatLengths)
		for _, c := range skeletonOrder(skel) {
			cs, ok := s.st.Chains[c]
			if !ok {
				if !slices.Contains(shared, "chain "+c+" missing") {
					shared = append(shared, "chain "+c+" missing")
				}
				continue
			}
			for _, r := range skel[c] {
				if !hasRule(cs, r) && !contains(shared, "chain "+c) && (s.anyRanges || !rangesLookup(r)) && (s.anyFlat || !flatDispatchRule(r)) {
					shared = append(shared, fmt.Sprintf("chain %s: rule %q missing", c, r.Text(s.family)))
				}
			}
		}
	}
	return shared
}

// flatSkeleton reports whether the table has the skeleton's parts for
// flat attachments whose hairpin sets have lengths: their maps and sets,
// and the dispatch chain's rules.
func (s *syncState) flatSkeleton(lengths []int) bool {
	for _, name := range flatSetNames(lengths) {
		if !s.st.Maps[name] {
			return false
		}
	}
	d := s.st.Chains[DispatchChain]
	if d == nil {
		return false
	}
	for _, r := range dispatchRules(lengths) {
		if flatDispatchRule(r) && !hasRule(d, r) {
			return false
		}
	}
	return true
}

// writeSync writes the repair: one transaction for the table, one for
// upstream's rules of pruned containers.
func (b *Backend) writeSync(s *syncState, fix converge.Repair[orphan]) (bool, error) {
	orphanChains, upIDs := map[string]bool{}, map[string]bool{}
	for _, or := range fix.Prune {
		if or.chain != "" {
			orphanChains[or.chain] = true
		} else {
			upIDs[or.upstreamID] = true
		}
	}
	tx := newTx(b.Family)
	var repaired []*plan.Plan
	for i := range fix.Broken {
		repaired = append(repaired, s.want[i])
	}
	need := lengthsOf(nil, repaired...)
	flatRepair := slices.ContainsFunc(repaired, isFlat)
	if fix.Shared || (len(fix.Broken) > 0 && !s.exists) || (flatRepair && !s.flatSkeleton(need)) {
		// the lengths the node has, and those of every wanted plan
		lengths := lengthsOf(s.st.Chains[DispatchChain], s.want...)
		for _, k := range sortedStrings(s.kinds) {
			addSkeleton(tx, s.kinds[k], lengths)
		}
	}
	desired, wantHP := s.desiredElements(tx, fix.Broken)
	cutIntervals(s.st, s.all, desired)
	for id, h := range s.st.Holders {
		if _, set := desired[id]; orphanChains[h] && !set {
			k, _ := keyFromID(id)
			desired[id] = Element{Key: k}
		}
	}
	writeElements(tx, s.st, desired)
	s.writeHairpins(tx, desired, wantHP)
	for _, name := range sortedChains(s.st) {
		if orphanChains[name] {
			dropRecord(tx, name, s.st.Chains[name])
			tx.add(opFlush, chainObj{name: name})
			tx.add(opDelete, chainObj{name: name})
		}
	}
	var txs []*Tx
	if tx.Len() > 0 {
		txs = append(txs, tx)
	}
	if len(upIDs) > 0 {
		if utx := upstreamTx(b.Family, s.up, upIDs); utx.Len() > 0 {
			txs = append(txs, utx)
		}
	}
	for _, t := range txs {
		if err := b.Kernel.Apply(t); err != nil {
			return false, fmt.Errorf("sync: %w", err)
		}
	}
	return len(txs) > 0, nil
}

// desiredElements rewrites the chains of the broken plans into tx and
// says which element each of their keys is to be (a Chain of "": none),
// and which hairpin elements the rewritten flat ones are to have, by
// chain. Element changes are computed as a whole, so that a key is
// deleted or added once even when a repair and a prune both touch it.
func (s *syncState) desiredElements(tx *Tx, broken map[int]bool) (map[string]Element, map[string][]Hairpin) {
	desired := map[string]Element{}
	wantHP := map[string][]Hairpin{}
	gone := func(k Key) {
		if _, set := desired[k.ID()]; !set {
			desired[k.ID()] = Element{Key: k}
		}
	}
	for i, p := range s.want {
		if !broken[i] {
			continue
		}
		chain := rewriteChain(tx, p, s.st.Chains[ChainName(p.Owner)])
		wantHP[chain.name] = []Hairpin{}
		mine := map[string]bool{}
		var won []Key
		for _, k := range Keys(p) {
			if !k.IsRange() {
				mine[k.ID()] = true
				if s.winner[k.port().ID()] == i {
					desired[k.ID()] = Element{Key: k, Chain: chain.name, To: targetOf(p, k), Srcs: hairpinSrcs(p)}
					if s.st.Holders[k.twin().ID()] != "" {
						gone(k.twin())
					}
					won = append(won, k)
				}
				continue
			}
			// the pieces of the interval the plan wins; an element of
			// one port that would shadow a won port goes
			for _, piece := range wonPieces(k, s.winner, i) {
				mine[piece.ID()] = true
				desired[piece.ID()] = Element{Key: piece, Chain: chain.name}
				for port := piece.Port; port <= piece.last(); port++ {
					for _, one := range []Key{{HostIP: k.HostIP, Protocol: k.Protocol, Port: port}, {HostIP: k.HostIP, Protocol: k.Protocol, Port: port, Flat: true}} {
						if h := s.st.Holders[one.ID()]; h != "" && h != chain.name {
							gone(one)
						}
					}
				}
			}
		}
		if isFlat(p) {
			wantHP[chain.name] = wantedHairpins(p, won)
		}
		for id, h := range s.st.Holders {
			if _, set := desired[id]; h == chain.name && !mine[id] && !set {
				k, _ := keyFromID(id)
				desired[id] = Element{Key: k}
			}
		}
	}
	return desired, wantHP
}

// writeElements adds to tx the element changes desired asks of st:
// deletions first, as the kernel checks an interval against the elements
// the transaction leaves.
func writeElements(tx *Tx, st *State, desired map[string]Element) {
	for _, deleting := range []bool{true, false} {
		for _, id := range sortedStrings(desired) {
			want := desired[id]
			cur := st.Holders[id]
			if cur == want.Chain && st.Targets[id] == want.To && slices.Equal(st.Srcs[id], want.Srcs) {
				continue
			}
			if deleting && cur != "" {
				tx.add(opDelete, elemObj{key: want.Key})
			}
			if !deleting && want.Chain != "" {
				tx.add(opAdd, elemObj{key: want.Key, chain: want.Chain, to: want.To, srcs: want.Srcs})
			}
		}
	}
}

// writeHairpins adds to tx the hairpin changes: a hairpin element stays
// while its owner holds its key after the repair (for a rewritten chain,
// while it wants it); the rewritten chains' wanted ones are added.
func (s *syncState) writeHairpins(tx *Tx, desired map[string]Element, wantHP map[string][]Hairpin) {
	holder := func(k Key) string {
		if d, ok := desired[k.ID()]; ok {
			return d.Chain
		}
		return s.st.Holders[k.ID()]
	}
	wanted := map[string]string{}
	for chain, hs := range wantHP {
		for _, h := range hs {
			wanted[h.ID()] = chain
		}
	}
	kept := map[string]bool{}
	for _, id := range sortedStrings(s.hairpins) {
		h := s.hairpins[id]
		_, rewritten := wantHP[h.Chain]
		if holder(h.Key) == h.Chain && (!rewritten || wanted[id] == h.Chain) {
			kept[id] = true
			continue
		}
		tx.add(opDelete, hairpinObj{h})
	}
	for _, chain := range sortedStrings(wantHP) {
		for _, h := range wantHP[chain] {
			if !kept[h.ID()] {
				tx.add(opAdd, hairpinObj{h})
			}
		}
	}
}

// judge says what of wanted plan i the table shows missing or wrong, or
// "".
func (s *syncState) judge(i int) string {
	p, st := s.want[i], s.st
	own := ChainName(p.Owner)
	c, ok := st.Chains[own]
	if !ok {
		return "chain " + own + " missing"
	}
	flat := isFlat(p)
	if flat {
		if why := judgeFlat(p, c); why != "" {
			return "chain " + own + ": " + why
		}
	} else if why := judgeChain(p, c); why != "" {
		return "chain " + own + ": " + why
	}
	var won []Key
	for _, k := range Keys(p) {
		k.Flat = flat
		if k.IsRange() {
			c := classOf(k)
			for port := k.Port; port <= k.Last; port++ {
				one := Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: port}
				if s.winner[one.ID()] != i {
					continue
				}
				if e, ok := s.served.at(c, port); !ok {
					return fmt.Sprintf("map %s has no element for %s", k.Map(), one)
				} else if e.Chain != own {
					return fmt.Sprintf("map %s sends %s to %s, not to %s", e.Key.Map(), one, e.Chain, own)
				}
			}
			continue
		}
		if s.winner[k.port().ID()] != i {
			continue // a newer attachment holds it
		}
		won = append(won, k)
		if h := st.Holders[k.twin().ID()]; h != "" && k.Flat {
			return fmt.Sprintf("map %s sends %s to %s before map %s", k.twin().Map(), k, h, k.Map())
		}
		if h := st.Holders[k.ID()]; h != own {
			if h == "" {
				return fmt.Sprintf("map %s has no element %s", k.Map(), k)
			}
			return fmt.Sprintf("map %s sends %s to %s, not to %s", k.Map(), k, h, own)
		}
		if to := targetOf(p, k); k.Flat && st.Targets[k.ID()] != to {
			return fmt.Sprintf("map %s sends %s to %s, not to %s", k.Map(), k, st.Targets[k.ID()], to)
		}
		if srcs := hairpinSrcs(p); k.Flat && !slices.Equal(st.Srcs[k.ID()], srcs) {
			return fmt.Sprintf("map %s: %s names hairpin sources %q, want %q", k.Map(), k, st.Srcs[k.ID()], srcs)
		}
	}
	if flat {
		for _, h := range wantedHairpins(p, won) {
			if s.hairpins[h.ID()].Chain != own {
				return fmt.Sprintf("set %s has no element %s . %s of %s", h.set(), h.Src, h.Key, own)
			}
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
func cutIntervals(st *State, all []Element, desired map[string]Element) {
	var adding []Key
	for id, to := range desired {
		if k, ok := keyFromID(id); ok && k.IsRange() && to.Chain != "" && st.Holders[id] != to.Chain {
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
		desired[e.Key.ID()] = Element{Key: e.Key}
		for _, piece := range subtract(e.Key, adding) {
			if _, set := desired[piece.ID()]; !set && st.Holders[piece.ID()] == "" {
				desired[piece.ID()] = Element{Key: piece, Chain: e.Chain}
			}
		}
	}
}

// elementsOfState lists the elements of a table read whole.
func elementsOfState(st *State) []Element {
	out := make([]Element, 0, len(st.Holders))
	for _, id := range sortedStrings(st.Holders) {
		if k, ok := keyFromID(id); ok {
			out = append(out, Element{Key: k, Chain: st.Holders[id], To: st.Targets[id], Srcs: st.Srcs[id]})
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
