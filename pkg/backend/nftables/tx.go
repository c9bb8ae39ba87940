package nftables

import (
	"encoding/binary"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Tx is one transaction of one family's table: what a verb writes, all
// or nothing. Text spells it as an nft script (golden files, and nft for
// a transaction holding conditions); Messages as the netlink batch the
// kernel gets. Both come from the same operations.
type Tx struct {
	Family plan.Family
	Table  string
	ops    []op
	nextID uint32
	anon   []anonSet
	// msgOp is, for each message Messages last returned, the index of the
	// operation it belongs to (errors name the operation).
	msgOp []int
}

type verb int

// String is the verb as nft spells it.
func (v verb) String() string { return [...]string{"add", "create", "flush", "delete"}[v] }

const (
	opAdd    verb = iota // create, or leave as is when it exists
	opCreate             // create, failing when it exists
	opFlush              // empty a chain
	opDelete             // remove; failing when absent
)

type op struct {
	verb verb
	obj  object
}

// object is one kind of nf_tables object a transaction writes. Each kind
// spells itself both ways — as knftables writes it (Text) and as netlink
// attributes (Messages) — and applies itself to the in-memory kernel
// (simulator, in memkernel_test.go), so a new kind is one type with three
// methods, not a case in three switches.
type object interface {
	// text writes verb v of the object in tx as nft reads it, the way
	// knftables writes it.
	text(tx *Tx, v verb, b *strings.Builder)
	// encode sets m's type and attributes for verb v in tx; messages the
	// object needs first (a rule's anonymous sets) are returned.
	encode(tx *Tx, v verb, m *nfnl.Msg, a *nfnl.Attrs) (first []nfnl.Msg, err error)
}

type tableObj struct{ comment string }

type chainObj struct {
	name    string
	comment string
	base    *baseChain
}

type mapObj struct {
	name     string
	addr     bool // keyed by host address too
	interval bool // keys are intervals of ports
}

type elemObj struct {
	key   Key
	chain string   // the verdict: goto chain; a flat key's comment ("" when deleting)
	to    string   // a flat key's target: "192.0.2.2:80"
	srcs  []string // a flat key's hairpin sources, in its comment
}

// Rule is one rule: its chain, its statements and its comment; or, with
// Handle set, the rule to delete.
type Rule struct {
	Chain   string
	stmts   []stmt
	Comment string
	Handle  uint64
}

// Text is the rule as nft syntax, without its comment.
func (r *Rule) Text(f plan.Family) string { return ruleText(f, r.stmts) }

type anonSet struct {
	name    string
	id      uint32
	keyType uint32
	keyLen  uint32
	elems   [][]byte
	// a map's: the type and length of its data, and each element's
	dataType, dataLen uint32
	data              [][]byte
}

func newTx(f plan.Family) *Tx { return &Tx{Family: f, Table: Table} }

func (tx *Tx) add(v verb, obj object) { tx.ops = append(tx.ops, op{v, obj}) }

// Len is the number of operations.
func (tx *Tx) Len() int { return len(tx.ops) }

// NeedsNft reports whether a rule holds conditions in nft syntax, which
// only nft can compile.
func (tx *Tx) NeedsNft() bool {
	for _, o := range tx.ops {
		if r, ok := o.obj.(*Rule); ok {
			for _, s := range r.stmts {
				if _, ok := s.(conditions); ok {
					return true
				}
			}
		}
	}
	return false
}

// Text is the transaction as an nft script, as knftables writes it.
func (tx *Tx) Text() string {
	var b strings.Builder
	for _, o := range tx.ops {
		o.obj.text(tx, o.verb, &b)
	}
	return b.String()
}

// dispatchMaps are the skeleton's maps, in the order the dispatch chain
// looks them up: a specific host IP before the wildcard, an exact port
// before an interval.
var dispatchMaps = []mapObj{
	{name: HostIPPortsMap, addr: true},
	{name: HostIPPortRangesMap, addr: true, interval: true},
	{name: HostPortsMap},
	{name: HostPortRangesMap, interval: true},
}

func isDispatchMap(name string) bool {
	for _, m := range dispatchMaps {
		if m.name == name {
			return true
		}
	}
	return false
}

func mapType(f plan.Family, addr bool) string {
	if !addr {
		return "inet_proto . inet_service : verdict"
	}
	if f == plan.IPv6 {
		return "ipv6_addr . inet_proto . inet_service : verdict"
	}
	return "ipv4_addr . inet_proto . inet_service : verdict"
}

// anonSet declares an anonymous constant set for a rule of this
// transaction (nft's { established, related }) and returns it.
func (tx *Tx) anonSet(keyType, keyLen uint32, elems [][]byte) anonSet {
	tx.nextID++
	s := anonSet{name: "__set%d", id: tx.nextID, keyType: keyType, keyLen: keyLen, elems: elems}
	tx.anon = append(tx.anon, s)
	return s
}

// anonMap declares an anonymous constant map for a rule of this
// transaction: elems[i] maps to data[i].
func (tx *Tx) anonMap(keyType, keyLen, dataType, dataLen uint32, elems, data [][]byte) anonSet {
	tx.nextID++
	s := anonSet{name: "__map%d", id: tx.nextID, keyType: keyType, keyLen: keyLen, elems: elems,
		dataType: dataType, dataLen: dataLen, data: data}
	tx.anon = append(tx.anon, s)
	return s
}

// nft's datatype numbers (TYPE_*) and a concatenation's type: the
// component types, 6 bits each.
const (
	typeIPv4Addr    = 7
	typeIPv6Addr    = 8
	typeInetProto   = 12
	typeInetService = 13
	ctStateType     = 26
	typeBits        = 6
	dataVerdict     = 0xffffff00 // NFT_DATA_VERDICT
)

func concatType(types ...uint32) uint32 {
	var t uint32
	for _, x := range types {
		t = t<<typeBits | x
	}
	return t
}

// Attribute numbers x/sys/unix does not name.
const (
	nftaTableUserdata   = 6  // NFTA_TABLE_USERDATA
	nftaChainUserdata   = 12 // NFTA_CHAIN_USERDATA
	nftaRuleUserdata    = unix.NFTA_RULE_USERDATA
	nftaSetUserdata     = 13   // NFTA_SET_USERDATA
	nftSetConcat        = 0x80 // NFT_SET_CONCAT
	nftaSetDescConcat   = 2    // NFTA_SET_DESC_CONCAT
	nftaSetFieldLen     = 1    // NFTA_SET_FIELD_LEN
	nftaSetElemKeyEnd   = 10   // NFTA_SET_ELEM_KEY_END
	nftaSetElemUserdata = 6    // NFTA_SET_ELEM_USERDATA
	udataComment        = 0    // NFTNL_UDATA_{TABLE,CHAIN,RULE}_COMMENT
	udataSetKeyOrder    = 0    // NFTNL_UDATA_SET_KEYBYTEORDER
	udataSetDataOrder   = 1    // NFTNL_UDATA_SET_DATABYTEORDER
	byteorderHost       = 1
	byteorderBig        = 2
)

// comment is libnftnl's user data holding a comment: type, length, the
// NUL-terminated text.
func comment(s string) []byte {
	b := []byte{udataComment, byte(len(s) + 1)}
	return append(append(b, s...), 0)
}

// Messages is the transaction as one netlink batch. It fails when a rule
// holds conditions (NeedsNft).
func (tx *Tx) Messages() ([]nfnl.Msg, error) {
	fam := uint8(nfproto(tx.Family))
	tx.anon, tx.nextID, tx.msgOp = nil, 0, nil
	out := make([]nfnl.Msg, 0, len(tx.ops))
	tx.msgOp = make([]int, 0, len(tx.ops))
	// The messages' attributes are written one after the other into
	// chunks of 64 KiB, not each into a buffer of its own: 5000 mappings
	// are 10,000 messages.
	var arena []byte
	for i, o := range tx.ops {
		if cap(arena)-len(arena) < 1024 {
			arena = make([]byte, 0, 64<<10)
		}
		free := arena[len(arena):]
		a := nfnl.AttrsIn(free)
		m := nfnl.Msg{Family: fam}
		first, err := o.obj.encode(tx, o.verb, &m, &a)
		if err != nil {
			return nil, err
		}
		for _, fm := range first {
			out = append(out, fm)
			tx.msgOp = append(tx.msgOp, i)
		}
		switch o.verb {
		case opAdd:
			m.Flags |= unix.NLM_F_CREATE
		case opCreate:
			m.Flags |= unix.NLM_F_CREATE | unix.NLM_F_EXCL
		}
		b := a.Bytes()
		if len(b) > 0 && len(b) <= cap(free) && &b[0] == &free[:1][0] { // written in place
			arena = arena[:len(arena)+len(b)]
		}
		m.Attrs = b[:len(b):len(b)] // an append to one cannot write into the next
		out = append(out, m)
		tx.msgOp = append(tx.msgOp, i)
	}
	return out, nil
}

// setUserdata is what nft records of a map's key for printing it.
func setUserdata(keyOrder uint32) []byte {
	b := []byte{udataSetKeyOrder, 4}
	b = binary.NativeEndian.AppendUint32(b, keyOrder)
	return b
}

func anonSetMsgs(fam uint8, table string, s anonSet) []nfnl.Msg {
	flags := uint32(unix.NFT_SET_ANONYMOUS | unix.NFT_SET_CONSTANT)
	if s.data != nil {
		flags |= unix.NFT_SET_MAP
	}
	var set nfnl.Attrs
	set.String(unix.NFTA_SET_TABLE, table)
	set.String(unix.NFTA_SET_NAME, s.name)
	set.U32(unix.NFTA_SET_FLAGS, flags)
	set.U32(unix.NFTA_SET_KEY_TYPE, s.keyType)
	set.U32(unix.NFTA_SET_KEY_LEN, s.keyLen)
	if s.data != nil {
		set.U32(unix.NFTA_SET_DATA_TYPE, s.dataType)
		set.U32(unix.NFTA_SET_DATA_LEN, s.dataLen)
	}
	set.U32(unix.NFTA_SET_ID, s.id)
	if s.data != nil {
		// the size, as nft gives it: the kernel picks a fixed hash
		set.Nested(unix.NFTA_SET_DESC, func(a *nfnl.Attrs) { a.U32(unix.NFTA_SET_DESC_SIZE, uint32(len(s.elems))) })
	} else {
		set.Raw(nftaSetUserdata, setUserdata(byteorderHost))
	}
	msgs := []nfnl.Msg{{Type: nfnl.NftType(unix.NFT_MSG_NEWSET), Flags: unix.NLM_F_CREATE, Family: fam, Attrs: set.Bytes()}}
	// The elements go in messages of at most elemChunk bytes of them: an
	// attribute's length is 16 bits, and a map of 5000 is ~180 KB.
	for from := 0; from < len(s.elems) || from == 0; {
		el := nfnl.AttrsIn(make([]byte, 0, elemChunk+1024))
		el.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		el.String(unix.NFTA_SET_ELEM_LIST_SET, s.name)
		el.U32(unix.NFTA_SET_ELEM_LIST_SET_ID, s.id)
		el.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
			start := len(a.Bytes())
			for ; from < len(s.elems) && len(a.Bytes())-start < elemChunk; from++ {
				a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
					dataValue(a, unix.NFTA_SET_ELEM_KEY, s.elems[from])
					if s.data != nil {
						dataValue(a, unix.NFTA_SET_ELEM_DATA, s.data[from])
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

// elemChunk bounds the bytes of elements in one message.
const elemChunk = 48 << 10

// elementAttrs names k's element of table; with chain, its verdict, or
// for a flat key its target and its owner's comment.
func elementAttrs(a *nfnl.Attrs, f plan.Family, table string, k Key, chain, to string, srcs ...string) {
	a.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	a.String(unix.NFTA_SET_ELEM_LIST_SET, k.Map())
	a.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
		a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
			dataValue(a, unix.NFTA_SET_ELEM_KEY, k.bytes())
			if k.IsRange() {
				end := k
				end.Port = k.Last
				dataValue(a, nftaSetElemKeyEnd, end.bytes())
			}
			switch {
			case chain == "":
			case k.Flat:
				dataValue(a, unix.NFTA_SET_ELEM_DATA, targetBytes(f, to))
				a.Raw(nftaSetElemUserdata, comment(flatComment(chain, srcs)))
			default:
				a.Nested(unix.NFTA_SET_ELEM_DATA, func(a *nfnl.Attrs) { verdictAttr(a, unix.NFT_GOTO, chain) })
			}
		})
	})
}

// bytes is the key as the kernel stores it: each field of the
// concatenation in network order, padded to 4 bytes.
func (k Key) bytes() []byte { return k.appendBytes(nil) }

// appendBytes appends the key's bytes to b.
func (k Key) appendBytes(b []byte) []byte {
	if k.HostIP != nil {
		if v4 := k.HostIP.To4(); v4 != nil {
			b = append(b, v4...)
		} else {
			b = append(b, k.HostIP.To16()...)
		}
	}
	b = append(b, protoNum(k.Protocol), 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(k.Port))
	return append(b, 0, 0)
}

func nfproto(f plan.Family) int {
	if f == plan.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// String is for errors: the transaction's first lines.
func (tx *Tx) String() string {
	t := tx.Text()
	if i := strings.Index(t, "\n"); i > 0 && strings.Count(t, "\n") > 1 {
		return t[:i] + " ..."
	}
	return strings.TrimSpace(t)
}
