package nft

import (
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// Registers, as nft allocates them: 128-bit NFT_REG_1/2 for single
// values, 32-bit registers from NFT_REG32_00 (8) for concatenations.
const (
	RegVerdict = 0
	Reg1       = 1
	Reg2       = 2
	Reg32      = 8
)

// Exprs collects a rule's expressions (List writes each) and the
// anonymous sets it declares, while its statements encode themselves.
type Exprs struct {
	List
	Family Family
	raw    bool      // a condition in nft syntax: only nft can compile it
	tx     *Tx       // its transaction, which numbers the sets
	anon   []AnonSet // the anonymous sets the rule declares
}

// List writes expressions, the parts of a rule as the kernel takes them
// (NFTA_RULE_EXPRESSIONS): each one an element of the list with its name
// and its attributes. The iptables backend writes the rules iptables-nft
// would write with it too, so an expression is spelled once.
type List struct{ To *nfnl.Attrs }

// Add appends expression name, whose attributes fill writes.
func (l List) Add(name string, fill func(a *nfnl.Attrs)) {
	l.To.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
		a.String(unix.NFTA_EXPR_NAME, name)
		a.Nested(unix.NFTA_EXPR_DATA, fill)
	})
}

// Cmp compares register reg with v by op (NFT_CMP_*).
func (l List) Cmp(op, reg uint32, v []byte) {
	l.Add("cmp", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_CMP_SREG, reg)
		a.U32(unix.NFTA_CMP_OP, op)
		Value(a, unix.NFTA_CMP_DATA, v)
	})
}

// Meta loads meta key (NFT_META_*) into reg.
func (l List) Meta(key, reg uint32) {
	l.Add("meta", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_META_DREG, reg)
		a.U32(unix.NFTA_META_KEY, key)
	})
}

// Payload loads length bytes at offset of header base (NFT_PAYLOAD_*)
// into reg.
func (l List) Payload(base, offset, length, reg uint32) {
	l.Add("payload", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_PAYLOAD_DREG, reg)
		a.U32(unix.NFTA_PAYLOAD_BASE, base)
		a.U32(unix.NFTA_PAYLOAD_OFFSET, offset)
		a.U32(unix.NFTA_PAYLOAD_LEN, length)
	})
}

// Bitwise sets reg to (reg & mask) ^ xor.
func (l List) Bitwise(reg uint32, mask, xor []byte) {
	l.Add("bitwise", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_BITWISE_SREG, reg)
		a.U32(unix.NFTA_BITWISE_DREG, reg)
		a.U32(unix.NFTA_BITWISE_LEN, uint32(len(mask)))
		Value(a, unix.NFTA_BITWISE_MASK, mask)
		Value(a, unix.NFTA_BITWISE_XOR, xor)
	})
}

// Verdict ends the rule with verdict code (to chain, for a jump or goto).
func (l List) Verdict(code int32, chain string) {
	l.Add("immediate", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
		a.Nested(unix.NFTA_IMMEDIATE_DATA, func(a *nfnl.Attrs) { VerdictData(a, code, chain) })
	})
}

// Counter counts packets and bytes, from zero.
func (l List) Counter() {
	l.Add("counter", func(a *nfnl.Attrs) {
		a.Raw(unix.NFTA_COUNTER_BYTES, make([]byte, 8))
		a.Raw(unix.NFTA_COUNTER_PACKETS, make([]byte, 8))
	})
}

// Match is x_tables match name of revision rev with its info (the
// match's struct as the kernel's xt module reads it), run by nft_compat.
func (l List) Match(name string, rev uint32, info []byte) {
	l.Add("match", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_MATCH_NAME, name)
		a.U32(unix.NFTA_MATCH_REV, rev)
		a.Raw(unix.NFTA_MATCH_INFO, info)
	})
}

// Target is x_tables target name of revision rev with its info, run by
// nft_compat.
func (l List) Target(name string, rev uint32, info []byte) {
	l.Add("target", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_TARGET_NAME, name)
		a.U32(unix.NFTA_TARGET_REV, rev)
		a.Raw(unix.NFTA_TARGET_INFO, info)
	})
}

// Value writes v as attribute typ holding NFTA_DATA_VALUE.
func Value(a *nfnl.Attrs, typ uint16, v []byte) {
	a.Nested(typ, func(a *nfnl.Attrs) { a.Raw(unix.NFTA_DATA_VALUE, v) })
}

// VerdictData writes verdict code (to chain, for a jump or goto) as
// NFTA_DATA_VERDICT.
func VerdictData(a *nfnl.Attrs, code int32, chain string) {
	a.Nested(unix.NFTA_DATA_VERDICT, func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_VERDICT_CODE, uint32(code))
		if chain != "" {
			a.String(unix.NFTA_VERDICT_CHAIN, chain)
		}
	})
}

// AnonSet declares an anonymous constant set of the rule's transaction
// and returns it, for a lookup to name.
func (e *Exprs) AnonSet(keyType, keyLen uint32, elems [][]byte) AnonSet {
	s := AnonSet{Name: "__set%d", ID: e.tx.NextID(), keyType: keyType, keyLen: keyLen, elems: elems}
	e.anon = append(e.anon, s)
	return s
}

// AnonMap declares an anonymous constant map of the rule's transaction:
// elems[i] maps to data[i].
func (e *Exprs) AnonMap(keyType, keyLen, dataType, dataLen uint32, elems, data [][]byte) AnonSet {
	s := AnonSet{Name: "__map%d", ID: e.tx.NextID(), keyType: keyType, keyLen: keyLen, elems: elems,
		dataType: dataType, dataLen: dataLen, data: data}
	e.anon = append(e.anon, s)
	return s
}

// AnonSet is an anonymous constant set or map a rule of the transaction
// declares (nft's { established, related }), named in the batch by its
// name and ID.
type AnonSet struct {
	Name    string
	ID      uint32
	keyType uint32
	keyLen  uint32
	elems   [][]byte
	// a map's: the type and length of its data, and each element's
	dataType, dataLen uint32
	data              [][]byte
}

// elemChunk bounds the bytes of elements in one message: an attribute's
// length is 16 bits, and a map of 5000 is ~180 KB.
const elemChunk = 48 << 10

func (s AnonSet) messages(fam uint8, table string) []nfnl.Msg {
	flags := uint32(unix.NFT_SET_ANONYMOUS | unix.NFT_SET_CONSTANT)
	if s.data != nil {
		flags |= unix.NFT_SET_MAP
	}
	var set nfnl.Attrs
	set.String(unix.NFTA_SET_TABLE, table)
	set.String(unix.NFTA_SET_NAME, s.Name)
	set.U32(unix.NFTA_SET_FLAGS, flags)
	set.U32(unix.NFTA_SET_KEY_TYPE, s.keyType)
	set.U32(unix.NFTA_SET_KEY_LEN, s.keyLen)
	if s.data != nil {
		set.U32(unix.NFTA_SET_DATA_TYPE, s.dataType)
		set.U32(unix.NFTA_SET_DATA_LEN, s.dataLen)
	}
	set.U32(unix.NFTA_SET_ID, s.ID)
	if s.data != nil {
		// the size, as nft gives it: the kernel picks a fixed hash
		set.Nested(unix.NFTA_SET_DESC, func(a *nfnl.Attrs) { a.U32(unix.NFTA_SET_DESC_SIZE, uint32(len(s.elems))) })
	} else {
		set.Raw(attrSetUserdata, setUserdata(byteorderHost))
	}
	msgs := []nfnl.Msg{{Type: nfnl.NftType(unix.NFT_MSG_NEWSET), Flags: unix.NLM_F_CREATE, Family: fam, Attrs: set.Bytes()}}
	for from := 0; from < len(s.elems) || from == 0; {
		el := nfnl.AttrsIn(make([]byte, 0, elemChunk+1024))
		el.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		el.String(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
		el.U32(unix.NFTA_SET_ELEM_LIST_SET_ID, s.ID)
		el.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
			start := len(a.Bytes())
			for ; from < len(s.elems) && len(a.Bytes())-start < elemChunk; from++ {
				a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
					Value(a, unix.NFTA_SET_ELEM_KEY, s.elems[from])
					if s.data != nil {
						Value(a, unix.NFTA_SET_ELEM_DATA, s.data[from])
					}
				})
			}
		})
		msgs = append(msgs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_NEWSETELEM), Flags: unix.NLM_F_CREATE, Family: fam, Attrs: el.Bytes()})
		if from == 0 {
			break
		}
	}
	return msgs
}
