package nftables

import (
	"fmt"
	"slices"
)

// reading is what a read shows of the maps an attachment's keys are in,
// however it was read (CHECK: its own keys' elements; a pass: the whole
// table): the exact keys' elements in st (Elements, a flat one's with its target
// and Srcs), the intervals in served (nil where no key is an interval),
// and the hairpin elements by their identity.
type reading struct {
	st       *State
	served   *view
	hairpins map[hairpinID]Hairpin
}

// judge says what of l r shows missing or wrong, or "": its chain c
// (nil: missing) with its rules, or a flat attachment's claims and
// owners element; the element of each key it should hold (wins: not
// those a newer attachment took over) in the map it belongs in, none
// before it in the verdict map; a flat key's target and hairpin sources;
// and a flat attachment's hairpin elements. CHECK and the agent's pass
// judge by it alike, with its messages.
func judge(l *layout, c *ChainState, r reading, wins func(Key) bool) string {
	own := l.chain.Name
	if c == nil {
		return "chain " + own + " missing"
	}
	if l.flat {
		if why := judgeFlat(l, c); why != "" {
			return why
		}
	} else if why := judgeChain(l, c); why != "" {
		return why
	}
	st := r.st
	for _, e := range l.elements {
		k := e.Key
		if k.IsRange() {
			if why := r.served.missingPort(k, own, wins); why != "" {
				return why
			}
			continue
		}
		if !wins(k.port()) {
			continue
		}
		if h := st.Elements[k.inOtherMap()].Chain; h != "" && k.Flat {
			return fmt.Sprintf("map %s sends %s to %s before map %s", k.inOtherMap().Map(), k, h, k.Map())
		}
		if h := st.Elements[k].Chain; h != own {
			if h != "" {
				return fmt.Sprintf("map %s sends %s to %s, not to %s", k.Map(), k, h, own)
			}
			if r.served != nil { // an interval took the port over
				if e, ok := r.served.at(classOf(k), k.Port); ok && e.Key.IsRange() {
					return fmt.Sprintf("map %s sends %s to %s, not to %s", e.Key.Map(), k, e.Chain, own)
				}
			}
			return fmt.Sprintf("missing element %s in map %s (to %s)", k, k.Map(), own)
		}
		got := st.Elements[k]
		if k.Flat && got.To != e.To {
			return fmt.Sprintf("map %s sends %s to %s, not to %s", k.Map(), k, got.To, e.To)
		}
		if k.Flat && !slices.Equal(got.Srcs, e.Srcs) {
			return fmt.Sprintf("map %s: %s names hairpin sources %q, want %q", k.Map(), k, got.Srcs, e.Srcs)
		}
	}
	for _, h := range l.hairpinsOf(wins) {
		if r.hairpins[h.id()].Chain != own {
			return fmt.Sprintf("set %s has no element %s . %s of %s", h.set(), h.Src, h.Key, own)
		}
	}
	return ""
}
