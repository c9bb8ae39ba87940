package nftables

import (
	"encoding/binary"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfexpr"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// How a rule is encoded for the kernel: its statements as nf_tables
// expressions (stmt.go says which), in the registers nft uses.

// Registers, as nft allocates them: 128-bit NFT_REG_1/2 for single values,
// 32-bit registers from NFT_REG32_00 (8) for concatenations.
const (
	regVerdict = 0
	reg1       = 1
	reg2       = 2
	reg32      = 8
)

// exprs collects a rule's expressions and the anonymous sets it needs.
type exprs struct {
	fam  plan.Family
	list *nfnl.Attrs // the rule's expression list, being written
	anon []anonSet
	raw  bool // a condition in nft syntax: only nft can compile it
	tx   *Tx
}

func (e *exprs) add(name string, fill func(a *nfnl.Attrs)) { nfexpr.Add(e.list, name, fill) }

func dataValue(a *nfnl.Attrs, typ uint16, v []byte) { nfexpr.Value(a, typ, v) }

func (e *exprs) cmp(op uint32, reg uint32, v []byte) { nfexpr.Cmp(e.list, op, reg, v) }

func (e *exprs) meta(key uint32, reg uint32) { nfexpr.Meta(e.list, key, reg) }

func (e *exprs) payload(base, offset, length, reg uint32) {
	nfexpr.Payload(e.list, base, offset, length, reg)
}

func (e *exprs) bitwise(reg uint32, mask, xor []byte) { nfexpr.Bitwise(e.list, reg, mask, xor) }

func (e *exprs) verdict(code int32, chain string) { nfexpr.Immediate(e.list, code, chain) }

func verdictAttr(a *nfnl.Attrs, code int32, chain string) { nfexpr.Verdict(a, code, chain) }

func ne32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func protoNum(p plan.Protocol) byte {
	switch p {
	case plan.UDP:
		return unix.IPPROTO_UDP
	case plan.SCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
}

// addrOffset is where the source or destination address sits in the
// family's network header.
func addrOffset(f plan.Family, dst bool) (offset, length uint32) {
	if f == plan.IPv6 {
		if dst {
			return 24, 16
		}
		return 8, 16
	}
	if dst {
		return 16, 4
	}
	return 12, 4
}

// attrs is the rule as the kernel gets it (NFTA_RULE_* attributes), the
// messages its anonymous sets need first, and whether it holds
// conditions, which only nft can compile (their match is then missing
// from the attributes).
func (v *Rule) attrs(tx *Tx, a *nfnl.Attrs) (first []nfnl.Msg, raw bool) {
	e := &exprs{fam: tx.Family, tx: tx, list: a}
	before := len(tx.anon)
	a.String(unix.NFTA_RULE_TABLE, tx.Table)
	a.String(unix.NFTA_RULE_CHAIN, v.Chain)
	a.Nested(unix.NFTA_RULE_EXPRESSIONS, func(*nfnl.Attrs) {
		for _, s := range v.stmts {
			s.encode(e)
		}
	})
	for _, s := range tx.anon[before:] {
		first = append(first, anonSetMsgs(uint8(nfproto(tx.Family)), tx.Table, s)...)
	}
	if v.Comment != "" {
		a.Raw(nftaRuleUserdata, comment(v.Comment))
	}
	return first, e.raw
}
