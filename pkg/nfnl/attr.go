package nfnl

import (
	"encoding/binary"
	"iter"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Attrs builds a sequence of netlink attributes.
type Attrs struct{ b []byte }

// AttrsIn returns a builder that writes into b's storage from its start
// while it fits (then into storage of its own, as append does).
func AttrsIn(b []byte) Attrs { return Attrs{b: b[:0]} }

// Bytes returns the encoded attributes.
func (a *Attrs) Bytes() []byte { return a.b }

// Grow makes room for n more bytes, so that building a large message
// does not copy it over and over.
func (a *Attrs) Grow(n int) { a.b = slices.Grow(a.b, n) }

// header appends an attribute header for a value of n bytes.
func (a *Attrs) header(typ uint16, n int) {
	a.b = binary.NativeEndian.AppendUint16(a.b, uint16(4+n))
	a.b = binary.NativeEndian.AppendUint16(a.b, typ)
}

// pad aligns the end to 4 bytes.
func (a *Attrs) pad() {
	for len(a.b)%4 != 0 {
		a.b = append(a.b, 0)
	}
}

// Raw appends attribute typ holding v.
func (a *Attrs) Raw(typ uint16, v []byte) *Attrs {
	a.header(typ, len(v))
	a.b = append(a.b, v...)
	a.pad()
	return a
}

// String appends a NUL-terminated string.
func (a *Attrs) String(typ uint16, s string) *Attrs {
	a.header(typ, len(s)+1)
	a.b = append(a.b, s...)
	a.b = append(a.b, 0)
	a.pad()
	return a
}

// U32 appends a big-endian (network order) 32-bit value, as nf_tables
// expects its integers.
func (a *Attrs) U32(typ uint16, v uint32) *Attrs {
	a.header(typ, 4)
	a.b = binary.BigEndian.AppendUint32(a.b, v)
	return a
}

// Nested appends attribute typ holding the attributes fill appends to
// the same builder (in place: its header's length is set after).
func (a *Attrs) Nested(typ uint16, fill func(*Attrs)) *Attrs {
	start := len(a.b)
	a.header(typ|unix.NLA_F_NESTED, 0)
	fill(a)
	a.pad()
	binary.NativeEndian.PutUint16(a.b[start:], uint16(len(a.b)-start))
	return a
}

// nlaTypeMask strips the nested and byte-order flags from a type.
const nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)

// Attr is one decoded attribute.
type Attr struct {
	Type  uint16
	Value []byte
}

// List is a decoded sequence of attributes.
type List []Attr

// Find returns the value of the first attribute typ of l.
func (l List) Find(typ uint16) ([]byte, bool) {
	for _, a := range l {
		if a.Type == typ {
			return a.Value, true
		}
	}
	return nil, false
}

// String is the first attribute typ of l up to its NUL; "" without one.
func (l List) String(typ uint16) string {
	v, _ := l.Find(typ)
	return Attr{Value: v}.String()
}

// Parse decodes a sequence of attributes; a truncated tail is ignored.
func Parse(b []byte) List {
	var out List
	for a := range All(b) {
		out = append(out, a)
	}
	return out
}

// All yields the attributes of b one by one, without allocating (reading
// a table of a thousand attachments decodes tens of thousands).
func All(b []byte) iter.Seq[Attr] {
	return func(yield func(Attr) bool) {
		for len(b) >= 4 {
			l := int(binary.NativeEndian.Uint16(b[0:2]))
			if l < 4 || l > len(b) {
				return
			}
			if !yield(Attr{Type: binary.NativeEndian.Uint16(b[2:4]) & nlaTypeMask, Value: b[4:l]}) {
				return
			}
			b = b[min(align(l), len(b)):]
		}
	}
}

// Find returns the value of the first attribute typ in b.
func Find(b []byte, typ uint16) ([]byte, bool) {
	for a := range All(b) {
		if a.Type == typ {
			return a.Value, true
		}
	}
	return nil, false
}

// FindU32 is the value of the first attribute typ in b as a big-endian
// 32-bit integer, 0 when absent or shorter.
func FindU32(b []byte, typ uint16) uint32 {
	v, _ := Find(b, typ)
	return Attr{Value: v}.U32()
}

// FindU64 is FindU32 of a 64-bit attribute (a handle).
func FindU64(b []byte, typ uint16) uint64 {
	if v, _ := Find(b, typ); len(v) >= 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// String is the value up to its NUL.
func (a Attr) String() string { s, _, _ := strings.Cut(string(a.Value), "\x00"); return s }

// U32 is the value as a big-endian 32-bit integer (0 when shorter).
func (a Attr) U32() uint32 {
	if len(a.Value) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(a.Value)
}
