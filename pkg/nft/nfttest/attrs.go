package nfttest

import (
	"encoding/binary"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// raw yields b's attributes with their types as sent (flags kept).
func raw(b []byte, yield func(typ uint16, v []byte)) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return
		}
		yield(binary.NativeEndian.Uint16(b[2:4]), b[4:l])
		b = b[min((l+3)&^3, len(b)):]
	}
}

const typeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)

// replaceString is attrs with string attribute typ set to s.
func replaceString(attrs []byte, typ uint16, s string) []byte {
	var out nfnl.Attrs
	raw(attrs, func(t uint16, v []byte) {
		if t&typeMask == typ {
			out.String(typ, s)
			return
		}
		out.Raw(t, v)
	})
	return out.Bytes()
}

// rewriteLookups is a rule's attributes with the set each lookup names
// (by name, or by ID for a set of the same batch) replaced by what name
// returns.
func rewriteLookups(attrs []byte, name func(set string, id uint32) string) []byte {
	var out nfnl.Attrs
	raw(attrs, func(t uint16, v []byte) {
		if t&typeMask != unix.NFTA_RULE_EXPRESSIONS {
			out.Raw(t, v)
			return
		}
		var list nfnl.Attrs
		raw(v, func(et uint16, ev []byte) {
			if str(ev, unix.NFTA_EXPR_NAME) != "lookup" {
				list.Raw(et, ev)
				return
			}
			var expr nfnl.Attrs
			raw(ev, func(xt uint16, xv []byte) {
				if xt&typeMask != unix.NFTA_EXPR_DATA {
					expr.Raw(xt, xv)
					return
				}
				set := name(str(xv, unix.NFTA_LOOKUP_SET), nfnl.FindU32(xv, unix.NFTA_LOOKUP_SET_ID))
				expr.Raw(xt, replaceString(xv, unix.NFTA_LOOKUP_SET, set))
			})
			list.Raw(et, expr.Bytes())
		})
		out.Raw(t, list.Bytes())
	})
	return out.Bytes()
}
