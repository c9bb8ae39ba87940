package nftables

import (
	"fmt"
	"slices"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// reading is what a read shows of the maps an attachment's keys are in,
// however it was read (CHECK: its own keys' elements; a pass: the whole
// table): the exact keys' elements in st (Holders, a flat one's Targets
// and Srcs), the intervals in served (nil where no key is an interval),
// and the hairpin elements by ID.
type reading struct {
	st       *State
	served   *view
	hairpins map[string]Hairpin
}

// judge says what of p's objects r shows missing or wrong, or "": its
// chain c (nil: missing) with its rules, or a flat attachment's claims
// and owners element; the element of each key it should hold (wins: not
// those a newer attachment took over) in the map it belongs in, none
// before it in the verdict map; a flat key's target and hairpin sources;
// and a flat attachment's hairpin elements. CHECK and the agent's pass
// judge by it alike, with its messages.
func judge(p *plan.Plan, c *ChainState, r reading, wins func(Key) bool) string {
	own := ChainName(p.Owner)
	if c == nil {
		return "chain " + own + " missing"
	}
	flat := isFlat(p)
	if flat {
		if why := judgeFlat(p, c); why != "" {
			return why
		}
	} else if why := judgeChain(p, c); why != "" {
		return why
	}
	st := r.st
	var won []Key
	for _, k := range Keys(p) {
		k.Flat = flat
		if k.IsRange() {
			if why := r.served.missingPort(k, own, wins); why != "" {
				return why
			}
			continue
		}
		if !wins(k.port()) {
			continue
		}
		won = append(won, k)
		if h := st.Holders[k.inOtherMap().ID()]; h != "" && k.Flat {
			return fmt.Sprintf("map %s sends %s to %s before map %s", k.inOtherMap().Map(), k, h, k.Map())
		}
		if h := st.Holders[k.ID()]; h != own {
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
		if to := targetOf(p, k); k.Flat && st.Targets[k.ID()] != to {
			return fmt.Sprintf("map %s sends %s to %s, not to %s", k.Map(), k, st.Targets[k.ID()], to)
		}
		if srcs := hairpinSrcs(p); k.Flat && !slices.Equal(st.Srcs[k.ID()], srcs) {
			return fmt.Sprintf("map %s: %s names hairpin sources %q, want %q", k.Map(), k, st.Srcs[k.ID()], srcs)
		}
	}
	if flat {
		for _, h := range wantedHairpins(p, won) {
			if r.hairpins[h.ID()].Chain != own {
				return fmt.Sprintf("set %s has no element %s . %s of %s", h.set(), h.Src, h.Key, own)
			}
		}
	}
	return ""
}
