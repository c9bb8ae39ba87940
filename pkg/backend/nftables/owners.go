package nftables

// A flat attachment's record: its chain's rules that name its keys and
// the owners map's element that holds a goto to the chain (flat.go).
// Here are both kinds, spelled as text and netlink, and read back.

import (
	"encoding/hex"
	"fmt"
	"net"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfexpr"
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

// recordRules are the rules of a flat attachment's chain that record its
// keys: each matches its key, and does nothing.
func recordRules(chain string, keys []Key) []*nft.Rule {
	out := make([]*nft.Rule, 0, len(keys))
	for _, k := range keys {
		stmts := []nft.Stmt{nft.L4Proto{Name: string(k.Protocol)}, nft.DPort{Port: k.Port, Last: 0}}
		if k.HostIP != nil {
			stmts = append(stmts, nft.Addr{Dst: true, Spec: k.HostIP.String()})
		}
		out = append(out, &nft.Rule{Chain: chain, Comment: recordComment + k.String(), Stmts: stmts})
	}
	return out
}

// splitRecord moves the chain's record rules, as read, into its Record.
func (c *ChainState) splitRecord() {
	rules := c.Rules[:0]
	for _, r := range c.Rules {
		s, ok := strings.CutPrefix(r.Comment, recordComment)
		if ok && r.Jump == "" && r.DNAT == "" && r.DNATMap == "" && r.Lookup == "" {
			if k, ok := parseKey(s); ok && !k.IsRange() {
				k.Flat = true
				c.Record, c.HasRecord = append(c.Record, k), true
				continue
			}
		}
		rules = append(rules, r)
	}
	c.Rules = rules
}

// dropRecord deletes what records a flat attachment beside its chain, as
// c was read: its owners element.
func dropRecord(tx *nft.Tx, name string, c *ChainState) {
	if c != nil && c.Owned {
		tx.Delete(ownerObj{name})
	}
}

func (v ownerObj) Text(tx *nft.Tx, vb nft.Verb, b *strings.Builder) {
	tx.Head(b, vb, "element")
	fmt.Fprintf(b, " %s { %s", ownersMap, net.IP(ownerKey(v.chain)))
	if vb == nft.Add || vb == nft.Create {
		b.WriteString(" : goto " + v.chain)
	}
	b.WriteString(" }\n")
}

func (v ownerObj) Encode(tx *nft.Tx, vb nft.Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	key := ownerKey(v.chain)
	if key == nil {
		return nil, fmt.Errorf("chain %q: not an attachment's name", v.chain)
	}
	target := v.chain
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSETELEM)
	if vb == nft.Delete {
		m.Type, target = nfnl.NftType(unix.NFT_MSG_DELSETELEM), ""
	}
	ownerAttrs(a, tx.TableName, key, target)
	return nil, nil
}

// ownerAttrs names the owners map's element of key; with chain, its goto.
func ownerAttrs(a *nfnl.Attrs, table string, key []byte, chain string) {
	a.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	a.String(unix.NFTA_SET_ELEM_LIST_SET, ownersMap)
	a.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
		a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
			nfexpr.Value(a, unix.NFTA_SET_ELEM_KEY, key)
			if chain != "" {
				a.Nested(unix.NFTA_SET_ELEM_DATA, func(a *nfnl.Attrs) { nfexpr.Verdict(a, unix.NFT_GOTO, chain) })
			}
		})
	})
}

// decodeOwners reads the chains of an owners map's GETSETELEM answer.
func decodeOwners(b []byte) []string {
	list, _ := nfnl.Find(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	var out []string
	for le := range nfnl.All(list) {
		data, _ := nfnl.Find(le.Value, unix.NFTA_SET_ELEM_DATA)
		v, _ := nfnl.Find(data, unix.NFTA_DATA_VERDICT)
		ch, _ := nfnl.Find(v, unix.NFTA_VERDICT_CHAIN)
		if chain, _, _ := strings.Cut(string(ch), "\x00"); chain != "" {
			out = append(out, chain)
		}
	}
	return out
}

// writeRecord makes the attachment's chain (created or flushed before)
// record keys and holds it in the owners map.
func writeRecord(tx *nft.Tx, name string, keys []Key) {
	for _, r := range recordRules(name, keys) {
		tx.Add(r)
	}
	tx.Add(ownerObj{name})
}
