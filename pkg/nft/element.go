package nft

import (
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// Element is one element of a set or map: its key (in an interval set
// with the key its interval ends with), its data — a goto verdict or a
// value — and its comment. Set gives the name and the types the key and
// data are spelled with; the bytes are as the kernel stores them, each
// field in network order, padded to 4 bytes.
type Element struct {
	Set     *Set
	Key     []byte
	KeyEnd  []byte // an interval's last key; nil for a key alone
	Goto    string // a verdict map's: the chain its verdict goes to
	Data    []byte // a data map's value
	Comment string
}

func (v *Element) Text(tx *Tx, vb Verb, b *strings.Builder) {
	tx.Head(b, vb, "element")
	b.WriteString(" " + v.Set.Name + " { " + fieldsText(v.Set.Key, v.Key, v.KeyEnd))
	if vb != Delete {
		if v.Comment != "" {
			fmt.Fprintf(b, " comment %q", v.Comment)
		}
		switch {
		case v.Goto != "":
			b.WriteString(" : goto " + v.Goto)
		case v.Data != nil:
			b.WriteString(" : " + fieldsText(v.Set.Data, v.Data, nil))
		}
	}
	b.WriteString(" }\n")
}

func (v *Element) Encode(tx *Tx, vb Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSETELEM)
	if vb == Delete {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELSETELEM)
	}
	v.Attrs(a, tx.TableName, vb != Delete)
	return nil, nil
}

// Attrs writes the element as a list of one of table's set (a GETSETELEM
// request, or a write of it): its key and, with data, its data and
// comment.
func (v *Element) Attrs(a *nfnl.Attrs, table string, data bool) {
	a.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	a.String(unix.NFTA_SET_ELEM_LIST_SET, v.Set.Name)
	a.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
		a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
			Value(a, unix.NFTA_SET_ELEM_KEY, v.Key)
			if v.KeyEnd != nil {
				Value(a, AttrSetElemKeyEnd, v.KeyEnd)
			}
			if !data {
				return
			}
			switch {
			case v.Goto != "":
				a.Nested(unix.NFTA_SET_ELEM_DATA, func(a *nfnl.Attrs) { VerdictData(a, unix.NFT_GOTO, v.Goto) })
			case v.Data != nil:
				Value(a, unix.NFTA_SET_ELEM_DATA, v.Data)
			}
			if v.Comment != "" {
				a.Raw(AttrSetElemUserdata, Comment(v.Comment))
			}
		})
	})
}

// Fields are a value of a concatenation of types as nft prints its
// fields; with end, each field that differs as a range: "tcp",
// "20000-20999".
func Fields(types []Type, b, end []byte) []string {
	out := make([]string, 0, len(types))
	for _, t := range types {
		w := int((t.Len + 3) &^ 3)
		if len(b) < w {
			break
		}
		s := t.format(b[:t.Len])
		if len(end) >= w && string(end[:t.Len]) != string(b[:t.Len]) {
			s += "-" + t.format(end[:t.Len])
		}
		out = append(out, s)
		b = b[w:]
		if len(end) >= w {
			end = end[w:]
		}
	}
	return out
}

func fieldsText(types []Type, b, end []byte) string {
	return strings.Join(Fields(types, b, end), " . ")
}

// format spells one value of t as nft does.
func (t Type) format(v []byte) string {
	switch t.ID {
	case IPv4Addr.ID, IPv6Addr.ID:
		return net.IP(v).String()
	case InetProto.ID:
		if p := ProtoName(v[0]); p != "" {
			return p
		}
		return strconv.Itoa(int(v[0]))
	case InetService.ID:
		return strconv.Itoa(int(binary.BigEndian.Uint16(v)))
	}
	return fmt.Sprintf("0x%x", v)
}
