package nftables

import (
	"errors"
	"fmt"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Check verifies that everything ADD made is there, reading only the
// shared chains, the attachment's own chain and its own keys' elements
// (single-element gets): its cost does not grow with the number of
// attachments.
func (b *Backend) Check(p *plan.Plan) error {
	fam := nftFamily(b.Family)
	skel := skeletonRules(p)
	for _, name := range skeletonOrder(skel) {
		c, err := b.Kernel.Chain(b.Family, Table, name)
		if err != nil {
			return fmt.Errorf("check chain %s: %w", name, err)
		}
		if c == nil {
			return fmt.Errorf("missing chain %s in table %s %s", name, fam, Table)
		}
		for _, r := range skel[name] {
			if !hasRule(c, r) {
				return fmt.Errorf("missing rule %q in chain %s", r.Text(b.Family), name)
			}
		}
	}
	own := ChainName(p.Owner)
	c, err := b.Kernel.Chain(b.Family, Table, own)
	if err != nil {
		return fmt.Errorf("check chain %s: %w", own, err)
	}
	if c == nil {
		return fmt.Errorf("missing chain %s in table %s %s", own, fam, Table)
	}
	if why := judgeChain(p, c); why != "" {
		return errors.New(why)
	}
	holders, err := b.Kernel.Holders(b.Family, Keys(p))
	if err != nil {
		return fmt.Errorf("check map elements: %w", err)
	}
	for _, k := range Keys(p) {
		if h := holders[k.ID()]; h != own {
			return fmt.Errorf("map %s sends %s to %q, not to %s", k.Map(), k, h, own)
		}
	}
	return nil
}

// hasRule reports whether chain c holds a rule doing what the shared
// rule r does.
func hasRule(c *ChainState, r *Rule) bool {
	for _, got := range c.Rules {
		for _, s := range r.stmts {
			var ok bool
			switch s := s.(type) {
			case vmapLookup:
				ok = got.Lookup == s.set
			case jumpTo:
				ok = got.Jump == s.chain
			case masquerade:
				ok = got.Masq
			case markOr:
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
	own := ChainName(p.Owner)
	rules := chainRules(p)
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
		for _, s := range r.stmts {
			switch s := s.(type) {
			case dnatTo:
				want := dnatTo{s.ip, s.port}.text(p.Family)
				if "dnat to "+got.DNAT != want {
					return fmt.Sprintf("rule for %s in chain %s does not %s", r.Comment[len(keyComment):], own, want)
				}
			case jumpTo:
				if got.Jump != s.chain {
					return fmt.Sprintf("rule %q in chain %s does not jump to %s", r.Comment, own, s.chain)
				}
			case addrIs:
				if !s.dst && !samePrefix(got.Saddr, s.spec) {
					return fmt.Sprintf("rule %q in chain %s does not match %s", r.Comment, own, s.text(p.Family))
				}
			}
		}
	}
	if len(c.Rules) != len(rules) {
		return fmt.Sprintf("chain %s holds %d rules, want %d", own, len(c.Rules), len(rules))
	}
	return ""
}
