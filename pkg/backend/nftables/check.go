package nftables

import (
	"errors"
	"fmt"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Check verifies that everything ADD made is there, reading only the
// shared chains, the attachment's own chain and its own keys' elements
// (single-element gets; a dump of its class for an interval key): its
// cost does not grow with the number of attachments.
func (b *Backend) Check(p *plan.Plan) error {
	own := ChainName(p.Owner)
	c, err := b.Kernel.Chain(b.Family, Table, own)
	if err != nil {
		return fmt.Errorf("check chain %s: %w", own, err)
	}
	flat := isFlat(p)
	lookups, err := b.skeleton(p, flat)
	if err != nil {
		return err
	}
	if c == nil {
		return errors.New(judge(p, nil, reading{}, nil))
	}
	keys := Keys(p)
	var read []Key
	for i := range keys {
		keys[i].Flat = flat
		read = append(read, keys[i])
		if flat {
			read = append(read, keys[i].inOtherMap())
		}
	}
	els, err := b.Kernel.Elements(b.Family, read)
	if err != nil {
		return fmt.Errorf("check map elements: %w", err)
	}
	// an interval of the chain's that the dispatch chain does not look
	// up: say that, not that its ports go nowhere
	for _, e := range els {
		if e.Chain == own && e.Key.IsRange() && !lookups[e.Key.Map()] {
			return fmt.Errorf("missing rule %q in chain %s", dispatchRule(e.Key.Map()).StmtText(nft.Family(b.Family)), DispatchChain)
		}
	}
	r := reading{st: newState(), served: newView(els, func(k Key) bool { return lookups[k.Map()] })}
	for _, e := range els {
		if !e.Key.IsRange() {
			r.st.Holders[e.Key.ID()] = e.Chain
			r.st.Targets[e.Key.ID()], r.st.Srcs[e.Key.ID()] = e.To, e.Srcs
		}
	}
	if flat {
		hps, err := b.Kernel.Hairpins(b.Family, wantedHairpins(p, keys))
		if err != nil {
			return fmt.Errorf("check hairpin elements: %w", err)
		}
		r.hairpins = make(map[string]Hairpin, len(hps))
		for _, h := range hps {
			r.hairpins[h.ID()] = h
		}
	}
	if why := judge(p, c, r, func(Key) bool { return true }); why != "" {
		return errors.New(why)
	}
	return nil
}

// Skeleton names what of the shared objects that ADD of plans like p
// makes is missing — the table, its base chains and their jumps, the
// dispatch chain's map lookups, the masquerade and guard chains — or "".
// It reads those chains alone: its cost does not grow with the number of
// attachments (STATUS).
func (b *Backend) Skeleton(p *plan.Plan) (missing string, some bool, err error) {
	// not the dispatch chain's rules for flat keys: CHECK of a flat
	// attachment asks for them
	_, err = b.skeleton(p, false)
	var m *missingError
	if errors.As(err, &m) {
		return m.what, m.some, nil
	}
	return "", err == nil, err
}

// missingError is a shared object found missing; some says that others
// (a chain of the table) exist.
type missingError struct {
	what string
	some bool
}

func (e *missingError) Error() string { return e.what }

// skeleton checks the shared chains of p and returns the maps the
// dispatch chain looks up; flat says p's attachment is flat, which needs
// the dispatch chain's rules for flat keys.
func (b *Backend) skeleton(p *plan.Plan, flat bool) (map[string]bool, error) {
	fam := nftFamily(b.Family)
	var lengths []int
	if flat {
		lengths = lengthsOf(nil, p)
	}
	skel := skeletonRules(p, lengths)
	var lookups map[string]bool
	var missing *missingError
	for _, name := range skeletonOrder(skel) {
		c, err := b.Kernel.Chain(b.Family, Table, name)
		if err != nil {
			return nil, fmt.Errorf("check chain %s: %w", name, err)
		}
		if c == nil {
			if missing == nil {
				missing = &missingError{what: fmt.Sprintf("missing chain %s in table %s %s", name, fam, Table)}
			}
			continue
		}
		if missing != nil {
			missing.some = true
			return nil, missing
		}
		if name == DispatchChain {
			lookups = map[string]bool{}
			for _, r := range c.Rules {
				lookups[r.Lookup] = true
			}
		}
		for _, r := range skel[name] {
			if !hasRule(c, r) && !rangesLookup(r) && (flat || !flatDispatchRule(r)) {
				return nil, &missingError{what: fmt.Sprintf("missing rule %q in chain %s", r.StmtText(nft.Family(b.Family)), name), some: true}
			}
		}
	}
	if missing != nil {
		return nil, missing
	}
	return lookups, nil
}

// rangesLookup reports whether r is the dispatch chain's lookup of an
// interval map. Its absence is judged by the elements that need it: a
// node set up before interval maps has none, and its attachments (which
// hold an element for each port) need none.
func rangesLookup(r *nft.Rule) bool {
	for _, s := range r.Stmts {
		if v, ok := s.(vmapLookup); ok && v.interval {
			return true
		}
	}
	return false
}

// dispatchRule is the dispatch chain's lookup of map name.
func dispatchRule(name string) *nft.Rule {
	for _, r := range dispatchRules(nil) {
		if v, ok := r.Stmts[0].(vmapLookup); ok && v.set == name {
			return r
		}
	}
	return nil
}

// hasRule reports whether chain c holds a rule doing what the shared
// rule r does.
func hasRule(c *ChainState, r *nft.Rule) bool {
	for _, got := range c.Rules {
		for _, s := range r.Stmts {
			var ok bool
			switch s := s.(type) {
			case vmapLookup:
				ok = got.Lookup == s.set
			case hairpinLookup:
				ok = got.Member == s.set()
			case dnatLookup:
				ok = got.DNATMap == s.set
			case nft.Jump:
				ok = got.Jump == s.To
			case nft.Masquerade:
				ok = got.Masq
			case nft.MarkOr:
				ok = got.SetMark
			case guardDrop:
				ok = got.Drop
			default:
				continue
			}
			if ok {
				return true
			}
		}
	}
	return false
}

// judgeChain says what of the attachment's own chain is missing or
// wrong, or "": each rule by its comment, what it jumps to or DNATs to,
// the hairpin source, and no rule more.
func judgeChain(p *plan.Plan, c *ChainState) string {
	return judgeRules(p, c, chainRules(p))
}

// judgeRules judges chain c against the rules it should hold.
func judgeRules(p *plan.Plan, c *ChainState, rules []*nft.Rule) string {
	own := ChainName(p.Owner)
	byComment := make(map[string]RuleState, len(c.Rules))
	for _, r := range c.Rules {
		if _, dup := byComment[r.Comment]; !dup {
			byComment[r.Comment] = r
		}
	}
	for _, r := range rules {
		got, ok := byComment[r.Comment]
		if !ok {
			return fmt.Sprintf("missing rule %q in chain %s", r.Comment, own)
		}
		for _, s := range r.Stmts {
			switch s := s.(type) {
			case nft.DNAT:
				want := s.Text(nft.Family(p.Family))
				if "dnat to "+got.DNAT != want {
					return fmt.Sprintf("rule for %s in chain %s does not %s", r.Comment[len(keyComment):], own, want)
				}
			case nft.Jump:
				if got.Jump != s.To {
					return fmt.Sprintf("rule %q in chain %s does not jump to %s", r.Comment, own, s.To)
				}
			case dnatMap:
				if why := judgeDNATs(p.Family, got.DNATs, s); why != "" {
					return fmt.Sprintf("rule %q in chain %s: %s", r.Comment, own, why)
				}
			case nft.Addr:
				if !s.Dst && !samePrefix(got.Saddr, s.Spec) {
					return fmt.Sprintf("rule %q in chain %s does not match %s", r.Comment, own, s.Text(nft.Family(p.Family)))
				}
			}
		}
	}
	if len(c.Rules) != len(rules) {
		return fmt.Sprintf("chain %s holds %d rules, want %d", own, len(c.Rules), len(rules))
	}
	return ""
}

// judgeDNATs says what a DNAT map read back lacks, or holds more, of
// what m should hold, or "".
func judgeDNATs(f plan.Family, got []MapDNAT, m dnatMap) string {
	to := make(map[string]string, len(got))
	for _, d := range got {
		to[d.Key.String()] = d.To
	}
	for _, e := range m.entries {
		want := nft.DNAT{IP: m.to, Port: e.port}.Text(nft.Family(f))
		if "dnat to "+to[e.key.String()] != want {
			return fmt.Sprintf("%s does not %s", e.key, want)
		}
	}
	if len(got) != len(m.entries) {
		return fmt.Sprintf("its map holds %d mappings, want %d", len(got), len(m.entries))
	}
	return ""
}

// judgeFlat says what of a flat attachment's chain and claims are wrong,
// or "": its chain holds no rule but its claim rules, which holds p's keys,
// and the owners map holds it.
func judgeFlat(p *plan.Plan, c *ChainState) string {
	own := ChainName(p.Owner)
	if len(c.Rules) > 0 {
		return fmt.Sprintf("chain %s holds %d rules besides its claim rules, want none (its keys are map elements)", own, len(c.Rules))
	}
	if !c.HasClaims {
		return fmt.Sprintf("chain %s claims no key", own)
	}
	if !c.Owned {
		return fmt.Sprintf("map %s holds no element for chain %s", ownersMap, own)
	}
	want := Keys(p)
	got := make(map[string]bool, len(c.Claims))
	for _, k := range c.Claims {
		got[k.ID()] = true
	}
	for _, k := range want {
		if !got[k.ID()] {
			return fmt.Sprintf("chain %s does not claim %s", own, k)
		}
	}
	if len(c.Claims) != len(want) {
		return fmt.Sprintf("chain %s claims %d keys, want %d", own, len(c.Claims), len(want))
	}
	return ""
}
