// Package nfexpr writes nf_tables expressions, the parts of a rule as
// the kernel takes them (NFTA_RULE_EXPRESSIONS): each one an element of
// the rule's list with its name and its attributes. Both backends write
// rules with it — the nftables backend its own, the iptables backend
// those iptables-nft would write — so an expression is spelled once.
package nfexpr

import (
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// Add appends expression name, whose attributes fill writes, to list.
func Add(list *nfnl.Attrs, name string, fill func(a *nfnl.Attrs)) {
	list.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
		a.String(unix.NFTA_EXPR_NAME, name)
		a.Nested(unix.NFTA_EXPR_DATA, fill)
	})
}

// Value writes v as attribute typ holding NFTA_DATA_VALUE.
func Value(a *nfnl.Attrs, typ uint16, v []byte) {
	a.Nested(typ, func(a *nfnl.Attrs) { a.Raw(unix.NFTA_DATA_VALUE, v) })
}

// Verdict writes verdict code (to chain, for a jump or goto) as
// NFTA_DATA_VERDICT.
func Verdict(a *nfnl.Attrs, code int32, chain string) {
	a.Nested(unix.NFTA_DATA_VERDICT, func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_VERDICT_CODE, uint32(code))
		if chain != "" {
			a.String(unix.NFTA_VERDICT_CHAIN, chain)
		}
	})
}

// Cmp compares register reg with v by op (NFT_CMP_*).
func Cmp(list *nfnl.Attrs, op, reg uint32, v []byte) {
	Add(list, "cmp", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_CMP_SREG, reg)
		a.U32(unix.NFTA_CMP_OP, op)
		Value(a, unix.NFTA_CMP_DATA, v)
	})
}

// Meta loads meta key (NFT_META_*) into register reg.
func Meta(list *nfnl.Attrs, key, reg uint32) {
	Add(list, "meta", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_META_DREG, reg)
		a.U32(unix.NFTA_META_KEY, key)
	})
}

// Payload loads length bytes at offset of header base (NFT_PAYLOAD_*)
// into register reg.
func Payload(list *nfnl.Attrs, base, offset, length, reg uint32) {
	Add(list, "payload", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_PAYLOAD_DREG, reg)
		a.U32(unix.NFTA_PAYLOAD_BASE, base)
		a.U32(unix.NFTA_PAYLOAD_OFFSET, offset)
		a.U32(unix.NFTA_PAYLOAD_LEN, length)
	})
}

// Bitwise sets register reg to (reg & mask) ^ xor.
func Bitwise(list *nfnl.Attrs, reg uint32, mask, xor []byte) {
	Add(list, "bitwise", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_BITWISE_SREG, reg)
		a.U32(unix.NFTA_BITWISE_DREG, reg)
		a.U32(unix.NFTA_BITWISE_LEN, uint32(len(mask)))
		Value(a, unix.NFTA_BITWISE_MASK, mask)
		Value(a, unix.NFTA_BITWISE_XOR, xor)
	})
}

// Immediate ends the rule with verdict code (to chain, for a jump or
// goto).
func Immediate(list *nfnl.Attrs, code int32, chain string) {
	Add(list, "immediate", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
		a.Nested(unix.NFTA_IMMEDIATE_DATA, func(a *nfnl.Attrs) { Verdict(a, code, chain) })
	})
}

// Counter counts packets and bytes, from zero.
func Counter(list *nfnl.Attrs) {
	Add(list, "counter", func(a *nfnl.Attrs) {
		a.Raw(unix.NFTA_COUNTER_BYTES, make([]byte, 8))
		a.Raw(unix.NFTA_COUNTER_PACKETS, make([]byte, 8))
	})
}

// Match is x_tables match name of revision rev with its info (the
// match's struct as the kernel's xt module reads it), run by nft_compat.
func Match(list *nfnl.Attrs, name string, rev uint32, info []byte) {
	Add(list, "match", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_MATCH_NAME, name)
		a.U32(unix.NFTA_MATCH_REV, rev)
		a.Raw(unix.NFTA_MATCH_INFO, info)
	})
}

// Target is x_tables target name of revision rev with its info, run by
// nft_compat.
func Target(list *nfnl.Attrs, name string, rev uint32, info []byte) {
	Add(list, "target", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_TARGET_NAME, name)
		a.U32(unix.NFTA_TARGET_REV, rev)
		a.Raw(unix.NFTA_TARGET_INFO, info)
	})
}
