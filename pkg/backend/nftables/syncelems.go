package nftables

// What a sync pass writes of the maps and sets: the elements each
// wanted plan should hold (the newest claim of a key winning), the
// writes that make the maps hold them, and the hairpin elements beside.

import (
	"maps"
	"slices"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// desiredElements says which element each key of the broken plans is
// to be (a Chain of "": none), and which hairpin elements the rewritten
// flat ones are to have, by chain: computed as a whole, so a key a
// repair and a prune both touch is written once.
func (s *syncState) desiredElements(broken map[int]bool) (map[Key]Element, map[string][]Hairpin) {
	desired := map[Key]Element{}
	wantHP := map[string][]Hairpin{}
	gone := func(k Key) {
		if _, set := desired[k]; !set {
			desired[k] = Element{Key: k}
		}
	}
	for i, l := range s.layouts {
		if !broken[i] {
			continue
		}
		chain := l.chain
		wantHP[chain.Name] = []Hairpin{}
		mine := map[Key]bool{}
		for _, e := range l.elements {
			k := e.Key
			if !k.IsRange() {
				mine[k] = true
				if s.wins(k.port(), i) {
					desired[k] = e
					if s.st.Elements[k.inOtherMap()].Chain != "" {
						gone(k.inOtherMap())
					}
				}
				continue
			}
			// the pieces of the interval the plan wins; an element of
			// one port that would shadow a won port goes
			for _, piece := range s.wonPieces(k, i) {
				mine[piece] = true
				desired[piece] = Element{Key: piece, Chain: chain.Name}
				s.shadowsIn(piece, chain.Name, gone)
			}
		}
		if l.flat {
			wantHP[chain.Name] = l.hairpinsOf(func(k Key) bool { return s.wins(k, i) })
		}
		for k, e := range s.st.Elements {
			if _, set := desired[k]; e.Chain == chain.Name && !mine[k] && !set {
				desired[k] = Element{Key: k}
			}
		}
	}
	return desired, wantHP
}

// writeElements adds to tx the element changes desired asks of st:
// deletions first, as the kernel checks an interval against the elements
// the transaction leaves.
func writeElements(tx *nft.Tx, st *State, desired map[Key]Element) {
	for _, deleting := range []bool{true, false} {
		for _, k := range slices.SortedFunc(maps.Keys(desired), compareKeys) {
			want := desired[k]
			cur := st.Elements[k]
			if cur.Chain == want.Chain && cur.To == want.To && slices.Equal(cur.Srcs, want.Srcs) {
				continue
			}
			if deleting && cur.Chain != "" {
				tx.Delete(Element{Key: want.Key})
			}
			if !deleting && want.Chain != "" {
				tx.Add(Element{Key: want.Key, Chain: want.Chain, To: want.To, Srcs: want.Srcs})
			}
		}
	}
}

// writeHairpins adds to tx the hairpin changes: a hairpin element stays
// while its owner holds its key after the repair (for a rewritten chain,
// while it wants it); the rewritten chains' wanted ones are added.
func (s *syncState) writeHairpins(tx *nft.Tx, desired map[Key]Element, wantHP map[string][]Hairpin) {
	holder := func(k Key) string {
		if d, ok := desired[k]; ok {
			return d.Chain
		}
		return s.st.Elements[k].Chain
	}
	wanted := map[hairpinID]string{}
	for chain, hs := range wantHP {
		for _, h := range hs {
			wanted[h.id()] = chain
		}
	}
	kept := map[hairpinID]bool{}
	for _, h := range slices.SortedFunc(maps.Values(s.hairpins), compareHairpins) {
		_, rewritten := wantHP[h.Chain]
		if holder(h.Key) == h.Chain && (!rewritten || wanted[h.id()] == h.Chain) {
			kept[h.id()] = true
			continue
		}
		tx.Delete(hairpinObj{h})
	}
	for _, chain := range slices.Sorted(maps.Keys(wantHP)) {
		for _, h := range wantHP[chain] {
			if !kept[h.id()] {
				tx.Add(hairpinObj{h})
			}
		}
	}
}

// wins says plan i is the newest to claim port (a key of one port); with
// no winner (ADD's slow path), plan i claims every port it asks for.
func (s *syncState) wins(port Key, i int) bool { return s.winner == nil || s.winner[port] == i }

// shadowsIn calls gone for each element of one port, in either exact
// map, that another chain than chain holds inside interval piece: it
// would shadow the piece. It looks each port up, or walks the elements
// when they are fewer.
func (s *syncState) shadowsIn(piece Key, chain string, gone func(Key)) {
	if piece.last()-piece.Port+1 > len(s.st.Elements) {
		for k, e := range s.st.Elements {
			if !k.IsRange() && e.Chain != chain && overlaps(k, piece) {
				gone(k)
			}
		}
		return
	}
	for port := piece.Port; port <= piece.last(); port++ {
		one := Key{HostIP: piece.HostIP, Protocol: piece.Protocol, Port: port}
		for _, k := range []Key{one, one.inOtherMap()} {
			if h := s.st.Elements[k].Chain; h != "" && h != chain {
				gone(k)
			}
		}
	}
}

// wonPieces are the runs of interval k's ports plan i wins, as keys.
func (s *syncState) wonPieces(k Key, i int) []Key {
	if s.winner == nil {
		return []Key{k}
	}
	var out []Key
	start := -1
	for port := k.Port; port <= k.Last+1; port++ {
		won := port <= k.Last && s.winner[Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: port}] == i
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
// of it is added back for its owner, but not a port of one that an
// element of one port holds, in either exact map (unless desired says
// otherwise).
func cutIntervals(st *State, all []Element, desired map[Key]Element) {
	var adding []Key
	for k, to := range desired {
		if k.IsRange() && to.Chain != "" && st.Elements[k].Chain != to.Chain {
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
		if _, set := desired[e.Key]; set {
			continue
		}
		desired[e.Key] = Element{Key: e.Key}
		held := func(k Key) bool {
			if d, set := desired[k]; set {
				return d.Chain != ""
			}
			return st.Elements[k].Chain != ""
		}
		for _, piece := range subtract(e.Key, adding) {
			if _, set := desired[piece]; !set && !held(piece) && (piece.IsRange() || !held(piece.inOtherMap())) {
				desired[piece] = Element{Key: piece, Chain: e.Chain}
			}
		}
	}
}

// elementsOfState lists the elements of a table read whole.
func elementsOfState(st *State) []Element {
	out := make([]Element, 0, len(st.Elements))
	for _, k := range slices.SortedFunc(maps.Keys(st.Elements), compareKeys) {
		out = append(out, st.Elements[k])
	}
	return out
}

// syncState is the family's tables as a pass read them, and what the
// wanted plans make of them.
type syncState struct {
	family plan.Family
	want   []*plan.Plan
	// layouts are the wanted plans', computed once
	layouts []*layout
	st, up  *State // the table (empty when absent) and upstream's
	exists  bool
	// winner is the newest plan of each port (nil: the one plan wins
	// every port it asks for); all and served are the table's elements,
	// read only when a wanted plan has intervals.
	winner    map[Key]int
	anyRanges bool
	all       []Element
	served    *view
	// kinds are the skeletons the wanted plans need, by name; flatLengths
	// the prefix lengths of the flat attachments' hairpin sets; hairpins
	// indexes the table's hairpin elements by identity.
	kinds       map[string]needs
	flatLengths []int
	hairpins    map[hairpinID]Hairpin
}
