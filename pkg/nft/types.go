package nft

import "encoding/binary"

// Type is one of nft's datatypes a set's key or data is made of: its
// name in nft, its number (TYPE_*) and the bytes of a value, before the
// kernel pads each field of a concatenation to 4.
type Type struct {
	Name string
	ID   uint32
	Len  uint32
}

// The datatypes portmap's layout uses.
var (
	IPv4Addr    = Type{"ipv4_addr", 7, 4}
	IPv6Addr    = Type{"ipv6_addr", 8, 16}
	InetProto   = Type{"inet_proto", 12, 1}
	InetService = Type{"inet_service", 13, 2}
	CTState     = Type{"ct_state", 26, 4}
	// Verdict is a verdict map's data.
	Verdict = Type{"verdict", 0xffffff00, 0} // NFT_DATA_VERDICT
)

// typeBits is the width of one type in a concatenation's type number.
const typeBits = 6

// ConcatType is the type number of a concatenation of types: the
// component types, 6 bits each.
func ConcatType(types ...Type) uint32 {
	var t uint32
	for _, x := range types {
		t = t<<typeBits | x.ID
	}
	return t
}

// ConcatLen is the length of a concatenation of types as the kernel
// stores it: each field padded to 4 bytes.
func ConcatLen(types ...Type) uint32 {
	var n uint32
	for _, x := range types {
		n += (x.Len + 3) &^ 3
	}
	return n
}

// Attribute numbers and values x/sys/unix does not name.
const (
	attrTableUserdata   = 6    // NFTA_TABLE_USERDATA
	AttrChainUserdata   = 12   // NFTA_CHAIN_USERDATA
	attrSetUserdata     = 13   // NFTA_SET_USERDATA
	setConcat           = 0x80 // NFT_SET_CONCAT
	attrSetDescConcat   = 2    // NFTA_SET_DESC_CONCAT
	attrSetFieldLen     = 1    // NFTA_SET_FIELD_LEN
	AttrSetElemKeyEnd   = 10   // NFTA_SET_ELEM_KEY_END
	AttrSetElemUserdata = 6    // NFTA_SET_ELEM_USERDATA
	udataComment        = 0    // NFTNL_UDATA_{TABLE,CHAIN,RULE,SET_ELEM}_COMMENT
	udataSetKeyOrder    = 0    // NFTNL_UDATA_SET_KEYBYTEORDER
	byteorderHost       = 1
	byteorderBig        = 2
)

// Comment is libnftnl's user data holding a comment, as nft writes it
// for a table, chain, rule or element: type, length, the NUL-terminated
// text.
func Comment(s string) []byte {
	b := []byte{udataComment, byte(len(s) + 1)}
	return append(append(b, s...), 0)
}

// CommentOf reads the comment out of libnftnl user data; "" when there
// is none.
func CommentOf(b []byte) string {
	for len(b) >= 2 {
		t, l := b[0], int(b[1])
		if 2+l > len(b) {
			break
		}
		if t == udataComment {
			s, _, _ := cutNUL(b[2 : 2+l])
			return s
		}
		b = b[2+l:]
	}
	return ""
}

func cutNUL(b []byte) (string, []byte, bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:], true
		}
	}
	return string(b), nil, false
}

// setUserdata is what nft records of a set's key for printing it.
func setUserdata(keyOrder uint32) []byte {
	b := []byte{udataSetKeyOrder, 4}
	return binary.NativeEndian.AppendUint32(b, keyOrder)
}
