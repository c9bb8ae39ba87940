package nft

import (
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfexpr"
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

// Exprs collects a rule's expressions (nfexpr writes each) and the
// anonymous sets it declares, while its statements encode themselves.
type Exprs struct {
	Family Family
	list   *nfnl.Attrs // the rule's expression list, being written
	raw    bool        // a condition in nft syntax: only nft can compile it
	tx     *Tx         // its transaction, which numbers the sets
	anon   []AnonSet   // the anonymous sets the rule declares

}

// Add appends expression name, whose attributes fill writes.
func (e *Exprs) Add(name string, fill func(a *nfnl.Attrs)) { nfexpr.Add(e.list, name, fill) }

// Cmp compares register reg with v by op (NFT_CMP_*).
func (e *Exprs) Cmp(op uint32, reg uint32, v []byte) { nfexpr.Cmp(e.list, op, reg, v) }

// Meta loads meta key (NFT_META_*) into reg.
func (e *Exprs) Meta(key uint32, reg uint32) { nfexpr.Meta(e.list, key, reg) }

// Payload loads length bytes at offset of header base into reg.
func (e *Exprs) Payload(base, offset, length, reg uint32) {
	nfexpr.Payload(e.list, base, offset, length, reg)
}

// Bitwise sets reg to reg & mask ^ xor.
func (e *Exprs) Bitwise(reg uint32, mask, xor []byte) { nfexpr.Bitwise(e.list, reg, mask, xor) }

// Verdict ends the rule with verdict code (to chain, for a jump or goto).
func (e *Exprs) Verdict(code int32, chain string) { nfexpr.Immediate(e.list, code, chain) }

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

func value(a *nfnl.Attrs, typ uint16, v []byte) { nfexpr.Value(a, typ, v) }

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
					value(a, unix.NFTA_SET_ELEM_KEY, s.elems[from])
					if s.data != nil {
						value(a, unix.NFTA_SET_ELEM_DATA, s.data[from])
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
