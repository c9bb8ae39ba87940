package nfttest

import (
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// Ruleset prints every table as it is held, one object a line, in the
// spirit of `nft --debug=netlink list ruleset`: each table, its chains
// (a base chain's type, hook and priority) with their rules' expressions
// and attributes, its sets (flags, key and data lengths) with their
// elements in hex; no handles. Tests compare it before and after a
// sequence: a whole-state picture independent of any reader of the
// user's.
func (k *Kernel) Ruleset() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var b strings.Builder
	for _, key := range k.sortedTables() {
		t := k.tables[key]
		fmt.Fprintf(&b, "table %s %s\n", familyName(key.family), key.name)
		for _, c := range t.chains {
			fmt.Fprintf(&b, "  chain %s", c.name)
			if hk, ok := nfnl.Find(c.attrs, unix.NFTA_CHAIN_HOOK); ok {
				fmt.Fprintf(&b, " type %s hook %d priority %d", str(c.attrs, unix.NFTA_CHAIN_TYPE),
					nfnl.FindU32(hk, unix.NFTA_HOOK_HOOKNUM), int32(nfnl.FindU32(hk, unix.NFTA_HOOK_PRIORITY)))
			}
			b.WriteString("\n")
			for _, r := range c.rules {
				b.WriteString("    ")
				list, _ := nfnl.Find(r.attrs, unix.NFTA_RULE_EXPRESSIONS)
				for e := range nfnl.All(list) {
					data, _ := nfnl.Find(e.Value, unix.NFTA_EXPR_DATA)
					fmt.Fprintf(&b, "[ %s%s ] ", str(e.Value, unix.NFTA_EXPR_NAME), attrsText(data))
				}
				if c := ruleComment(r.attrs); c != "" {
					fmt.Fprintf(&b, "comment %q", c)
				}
				b.WriteString("\n")
			}
		}
		for _, s := range t.sets {
			fmt.Fprintf(&b, "  set %s flags %#x key %d", s.name, s.flags, nfnl.FindU32(s.attrs, unix.NFTA_SET_KEY_LEN))
			if _, ok := nfnl.Find(s.attrs, unix.NFTA_SET_DATA_TYPE); ok {
				fmt.Fprintf(&b, " data %#x", nfnl.FindU32(s.attrs, unix.NFTA_SET_DATA_TYPE))
			}
			b.WriteString("\n")
			for _, e := range s.elements {
				fmt.Fprintf(&b, "    %x", e.key)
				if e.end != nil {
					fmt.Fprintf(&b, "-%x", e.end)
				}
				switch v, ok := nfnl.Find(e.data, unix.NFTA_DATA_VERDICT); {
				case ok:
					code, chain := nfnl.Verdict(v)
					fmt.Fprintf(&b, " : verdict %d %s", code, chain)
				case e.data != nil:
					fmt.Fprintf(&b, " : %x", nft.ValueOf(e.attrs, unix.NFTA_SET_ELEM_DATA))
				}
				b.WriteString("\n")
			}
		}
	}
	return b.String()
}

// sortedTables are the tables' keys by family, then name.
func (k *Kernel) sortedTables() []tableKey {
	keys := slices.Collect(maps.Keys(k.tables))
	slices.SortFunc(keys, func(a, b tableKey) int { return cmp.Or(cmp.Compare(a.family, b.family), cmp.Compare(a.name, b.name)) })
	return keys
}

// attrsText spells an expression's attributes as "type=value": a name
// quoted, nested attributes in braces (data: values, verdicts), an
// expression's own 4-byte attribute (register, operation, key) as a
// number, any other value in hex.
func attrsText(b []byte) string { return attrsOf(b, false) }

func attrsOf(b []byte, data bool) string {
	var out strings.Builder
	raw(b, func(typ uint16, v []byte) {
		fmt.Fprintf(&out, " %d=", typ&typeMask)
		switch {
		case typ&unix.NLA_F_NESTED != 0 || nested(v):
			out.WriteString("{" + strings.TrimSpace(attrsOf(v, true)) + "}")
		case printable(v):
			fmt.Fprintf(&out, "%q", strings.TrimRight(string(v), "\x00"))
		case len(v) == 4 && !data:
			fmt.Fprintf(&out, "%d", int32(binary.BigEndian.Uint32(v)))
		default:
			out.WriteString(hex.EncodeToString(v))
		}
	})
	return out.String()
}

// nested reports whether v parses as attributes to its end (the data of
// cmp, immediate and bitwise are, without the flag).
func nested(v []byte) bool {
	n := 0
	for len(v) >= 4 {
		l := int(binary.NativeEndian.Uint16(v))
		if l < 4 || l > len(v) {
			return false
		}
		v, n = v[min((l+3)&^3, len(v)):], n+1
	}
	return len(v) == 0 && n > 0
}

func printable(v []byte) bool {
	s := strings.TrimRight(string(v), "\x00")
	return len(s) > 1 && strings.IndexFunc(s, func(r rune) bool { return r < ' ' || r > '~' }) < 0
}

// ruleComment is the comment in a rule's user data.
func ruleComment(attrs []byte) string {
	ud, _ := nfnl.Find(attrs, unix.NFTA_RULE_USERDATA)
	return nft.CommentOf(ud)
}

func familyName(f uint8) string {
	switch f {
	case unix.NFPROTO_IPV4:
		return "ip"
	case unix.NFPROTO_IPV6:
		return "ip6"
	case unix.NFPROTO_INET:
		return "inet"
	}
	return fmt.Sprint(f)
}
