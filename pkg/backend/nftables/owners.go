package nftables

// A flat attachment's claims (flat.go): its claim rules and its owners
// map element; and the deletion of chains with all that points at them,
// claims included (DEL, GC, a pass's prune).

import (
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// ownersSet declares the map of owners: a chain name's hashes to a goto
// to the chain.
func ownersSet() *nft.Set {
	return &nft.Set{Name: ownersMap, Key: []nft.Type{nft.IPv6Addr}, Data: []nft.Type{nft.Verdict}}
}

// ownerObj is chain's element of the owners map.
type ownerObj struct{ chain string }

// ownerKey is the owners map's key of chain, "dn-<16 hex>-<16 hex>": its
// hashes' 16 bytes; nil for a name of another shape.
func ownerKey(chain string) []byte {
	rest, ok := strings.CutPrefix(chain, "dn-")
	if !ok || len(rest) != 33 || rest[16] != '-' {
		return nil
	}
	b, err := hex.DecodeString(rest[:16] + rest[17:])
	if err != nil {
		return nil
	}
	return b
}

// splitClaims moves the chain's claim rules, as read, into its Claims.
func (c *ChainState) splitClaims() {
	rules := c.Rules[:0]
	for _, r := range c.Rules {
		s, ok := strings.CutPrefix(r.Comment, claimComment)
		if ok && matchesOnly(r.Rule) {
			if k, ok := parseKey(s); ok && !k.IsRange() {
				k.Flat = true
				c.Claims, c.HasClaims = append(c.Claims, k), true
				continue
			}
		}
		rules = append(rules, r)
	}
	c.Rules = rules
}

// matchesOnly says r only matches (a protocol, ports, an address), as
// a claim rule does.
func matchesOnly(r *nft.Rule) bool {
	return !slices.ContainsFunc(r.Stmts, func(s nft.Stmt) bool {
		switch s.(type) {
		case nft.L4Proto, nft.DPort, nft.Addr:
			return false
		}
		return true
	})
}

// dropClaims deletes what claims a flat attachment's keys beside its chain, as
// c was read: its owners element.
func dropClaims(tx *nft.Tx, name string, c *ChainState) {
	if c != nil && c.Owned {
		tx.Delete(ownerObj{name})
	}
}

// element is chain's element of the owners map: its name's hashes, and
// a goto to it.
func (v ownerObj) element() *nft.Element {
	return &nft.Element{Set: ownersSet(), Key: ownerKey(v.chain), Goto: v.chain}
}

func (v ownerObj) Text(tx *nft.Tx, vb nft.Verb, b *strings.Builder) { v.element().Text(tx, vb, b) }

func (v ownerObj) Encode(tx *nft.Tx, vb nft.Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	if ownerKey(v.chain) == nil {
		return nil, fmt.Errorf("chain %q: not an attachment's name", v.chain)
	}
	return v.element().Encode(tx, vb, m, a)
}

// decodeOwners reads the chains of an owners map's GETSETELEM answer.
func decodeOwners(b []byte) []string {
	var out []string
	for _, e := range nft.DecodeElements(b) {
		if e.Goto != "" {
			out = append(out, e.Goto)
		}
	}
	return out
}

// removeChains deletes the chains of set and the elements that point at
// them, in name order.
func removeChains(tx *nft.Tx, s *State, set map[string]bool) {
	for _, k := range slices.SortedFunc(maps.Keys(s.Elements), compareKeys) {
		if set[s.Elements[k].Chain] {
			tx.Delete(Element{Key: k})
		}
	}
	for _, h := range s.Hairpins {
		if set[h.Chain] {
			tx.Delete(hairpinObj{h})
		}
	}
	dropChains(tx, s.Chains, set)
}

// dropChains deletes the chains of set, as read in chains, with their
// owners elements, in name order.
func dropChains(tx *nft.Tx, chains map[string]*ChainState, set map[string]bool) {
	for _, name := range slices.Sorted(maps.Keys(chains)) {
		if set[name] {
			dropClaims(tx, name, chains[name])
			tx.Flush(&nft.Chain{Name: name})
			tx.Delete(&nft.Chain{Name: name})
		}
	}
}
