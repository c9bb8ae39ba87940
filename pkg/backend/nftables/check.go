package nftables

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Check judges what ADD made (judge), reading only the shared chains,
// the attachment's chain and its own keys' elements: its cost does not
// grow with the number of attachments.
func (b *Backend) Check(p *plan.Plan) error {
	l := layoutOf(p)
	q := Query{Chains: append([]string{l.chain.Name}, skeletonChains(l.needs)...), Keys: l.keys}
	if l.flat {
		q.Keys, q.Hairpins = withOtherMaps(l.keys), l.hairpins
	}
	st, err := b.Kernel.Read(b.Family, q)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if err := skeletonIn(b.Family, st, l.needs, l.lengths); err != nil {
		return err
	}
	c := st.Chains[l.chain.Name]
	if c == nil {
		return errors.New(judge(l, nil, reading{}, nil))
	}
	r := reading{st: st, served: newView(elementsOfState(st)), hairpins: map[hairpinID]Hairpin{}}
	for _, h := range st.Hairpins {
		r.hairpins[h.id()] = h
	}
	if why := judge(l, c, r, func(Key) bool { return true }); why != "" {
		return errors.New(why)
	}
	return nil
}

// Skeleton names what of the shared chains ADD of plans like p makes is
// missing, or "" (STATUS), reading those chains alone.
func (b *Backend) Skeleton(p *plan.Plan) (missing string, some bool, err error) {
	// not the dispatch chain's hairpin lookups of a flat attachment's
	// prefix lengths: CHECK of that attachment asks for them
	l := layoutOf(p)
	st, err := b.Kernel.Read(b.Family, Query{Chains: skeletonChains(l.needs)})
	if err != nil {
		return "", false, fmt.Errorf("check: %w", err)
	}
	err = skeletonIn(b.Family, st, l.needs, nil)
	var m *missingError
	if errors.As(err, &m) {
		return m.what, m.some, nil
	}
	return "", true, nil
}

// judgeChain says what of the attachment's own chain is missing or
// wrong, or "": each rule, found by its comment, doing what it is
// written to do (nft.Rule.Lacks), a DNAT map holding its mappings,
// and no rule more.
func judgeChain(l *layout, c *ChainState) string {
	own, f := l.chain.Name, nft.Family(l.family)
	byComment := make(map[string]RuleState, len(c.Rules))
	for _, r := range c.Rules {
		if _, dup := byComment[r.Comment]; !dup {
			byComment[r.Comment] = r
		}
	}
	for _, r := range l.rules {
		got, ok := byComment[r.Comment]
		if !ok {
			return fmt.Sprintf("missing rule %q in chain %s", r.Comment, own)
		}
		if lacks := got.Lacks(f, r.AsRead(f)); lacks != "" {
			return fmt.Sprintf("rule %q in chain %s does not %s", r.Comment, own, lacks)
		}
		for _, s := range r.Stmts {
			if m, ok := s.(dnatMap); ok {
				if why := judgeDNATs(f, got.DNATs, m); why != "" {
					return fmt.Sprintf("rule %q in chain %s: %s", r.Comment, own, why)
				}
			}
		}
	}
	if len(c.Rules) != len(l.rules) {
		return fmt.Sprintf("chain %s holds %d rules, want %d", own, len(c.Rules), len(l.rules))
	}
	return ""
}

// judgeDNATs says what a DNAT map read back lacks, or holds more, of
// what m should hold, or "".
func judgeDNATs(f nft.Family, got []MapDNAT, m dnatMap) string {
	to := make(map[Key]netip.AddrPort, len(got))
	for _, d := range got {
		to[d.Key] = d.To
	}
	for _, e := range m.entries {
		if want := nft.DNATTo(m.to, e.port); to[e.key] != want.To {
			return fmt.Sprintf("%s does not %s", e.key, want.Text(f))
		}
	}
	if len(got) != len(m.entries) {
		return fmt.Sprintf("its map holds %d mappings, want %d", len(got), len(m.entries))
	}
	return ""
}

// judgeFlat says what of a flat attachment's chain and claims are wrong,
// or "": its chain holds no rule but its claim rules, which claim its
// keys, and the owners map holds it.
func judgeFlat(l *layout, c *ChainState) string {
	own := l.chain.Name
	if len(c.Rules) > 0 {
		return fmt.Sprintf("chain %s holds %d rules besides its claim rules, want none (its keys are map elements)", own, len(c.Rules))
	}
	if !c.HasClaims {
		return fmt.Sprintf("chain %s claims no key", own)
	}
	if !c.Owned {
		return fmt.Sprintf("map %s holds no element for chain %s", ownersMap, own)
	}
	want := l.keys
	got := make(map[Key]bool, len(c.Claims))
	for _, k := range c.Claims {
		got[k] = true
	}
	for _, k := range want {
		if !got[k] {
			return fmt.Sprintf("chain %s does not claim %s", own, k)
		}
	}
	if len(c.Claims) != len(want) {
		return fmt.Sprintf("chain %s claims %d keys, want %d", own, len(c.Claims), len(want))
	}
	return ""
}
