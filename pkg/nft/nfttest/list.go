package nfttest

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// List prints what the kernel holds as nft text (nft list ruleset), in the spelling of
// pkg/nft's objects and statements: each table with its named sets and
// maps (type, flags, elements, sorted) and its chains (comment, a base
// chain's type, hook and priority, then each rule). A rule is read back
// from its expressions as nft reads the kernel's (payload and meta loads
// into registers, then the compares, lookups and statements that use
// them), so a rule a statement's Encode wrote reads as that statement's
// Text: a test holds the two spellings to each other without root, and
// compares whole rulesets in words. It fails naming an expression or a
// value it does not know. Conditions (nft syntax only nft compiles) are
// not held, so they are not printed.
func (k *Kernel) List() (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var b strings.Builder
	for _, key := range k.sortedTables() {
		t := k.tables[key]
		fmt.Fprintf(&b, "table %s %s {\n", familyName(key.family), key.name)
		if ud, ok := nfnl.Find(t.attrs, tableUserdata); ok && nft.CommentOf(ud) != "" {
			fmt.Fprintf(&b, "\tcomment %q\n", nft.CommentOf(ud))
		}
		for _, s := range t.sets {
			if s.flags&unix.NFT_SET_ANONYMOUS == 0 {
				if err := dumpSet(&b, s); err != nil {
					return "", fmt.Errorf("table %s: %w", key.name, err)
				}
			}
		}
		for _, c := range t.chains {
			fmt.Fprintf(&b, "\tchain %s {\n", c.name)
			if ud, ok := nfnl.Find(c.attrs, nft.AttrChainUserdata); ok {
				fmt.Fprintf(&b, "\t\tcomment %q\n", nft.CommentOf(ud))
			}
			if hk, ok := nfnl.Find(c.attrs, unix.NFTA_CHAIN_HOOK); ok {
				fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d\n", str(c.attrs, unix.NFTA_CHAIN_TYPE),
					hookName(nfnl.FindU32(hk, unix.NFTA_HOOK_HOOKNUM)), int32(nfnl.FindU32(hk, unix.NFTA_HOOK_PRIORITY)))
			}
			for _, r := range c.rules {
				text, err := ruleText(key.family, r.attrs, t)
				if err != nil {
					return "", fmt.Errorf("chain %s: %w", c.name, err)
				}
				b.WriteString("\t\t" + text + "\n")
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String(), nil
}

// tableUserdata is NFTA_TABLE_USERDATA, which x/sys does not name.
const tableUserdata = 6

// dumpSet prints a named set or map, its elements one a line, sorted.
func dumpSet(b *strings.Builder, s *set) error {
	keyTypes, dataTypes, err := setTypes(s)
	if err != nil {
		return err
	}
	kind, typ := "set", typeNames(keyTypes)
	if s.flags&unix.NFT_SET_MAP != 0 {
		kind, typ = "map", typ+" : "+typeNames(dataTypes)
	}
	fmt.Fprintf(b, "\t%s %s {\n\t\ttype %s\n", kind, s.name, typ)
	if s.flags&unix.NFT_SET_INTERVAL != 0 {
		b.WriteString("\t\tflags interval\n")
	}
	lines := make([]string, 0, len(s.elements))
	for _, e := range s.elements {
		lines = append(lines, elementText(e, keyTypes, dataTypes))
	}
	slices.Sort(lines)
	for _, l := range lines {
		b.WriteString("\t\t" + l + "\n")
	}
	b.WriteString("\t}\n")
	return nil
}

// elementText is an element as the transaction's text spells it: its
// key (an interval's fields as ranges), comment, data.
func elementText(e *element, keyTypes, dataTypes []nft.Type) string {
	t := strings.Join(nft.Fields(keyTypes, e.key, e.end), " . ")
	if len(keyTypes) == 1 && keyTypes[0] == nft.CTState && len(e.key) == 4 {
		t, _ = ctStateText(binary.NativeEndian.Uint32(e.key))
	}
	if ud, ok := nfnl.Find(e.attrs, nft.AttrSetElemUserdata); ok && nft.CommentOf(ud) != "" {
		t += fmt.Sprintf(" comment %q", nft.CommentOf(ud))
	}
	if v, ok := nfnl.Find(e.data, unix.NFTA_DATA_VERDICT); ok {
		return t + " : " + verdictText(nfnl.Verdict(v))
	}
	if e.data != nil {
		t += " : " + strings.Join(nft.Fields(dataTypes, nft.ValueOf(e.attrs, unix.NFTA_SET_ELEM_DATA), nil), " . ")
	}
	return t
}

// knownTypes are the datatypes a set's type number is read into.
var knownTypes = []nft.Type{nft.IPv4Addr, nft.IPv6Addr, nft.InetProto, nft.InetService, nft.CTState}

// setTypes reads a set's key and data types from their type numbers (a
// concatenation's: 6 bits a type, the first the highest).
func setTypes(s *set) (key, data []nft.Type, err error) {
	split := func(id uint32) ([]nft.Type, error) {
		if id == nft.Verdict.ID {
			return []nft.Type{nft.Verdict}, nil
		}
		var out []nft.Type
		for ; id != 0; id >>= 6 {
			i := slices.IndexFunc(knownTypes, func(t nft.Type) bool { return t.ID == id&0x3f })
			if i < 0 {
				return nil, fmt.Errorf("set %s: datatype %d", s.name, id&0x3f)
			}
			out = append([]nft.Type{knownTypes[i]}, out...)
		}
		return out, nil
	}
	if key, err = split(nfnl.FindU32(s.attrs, unix.NFTA_SET_KEY_TYPE)); err != nil {
		return nil, nil, err
	}
	if s.flags&unix.NFT_SET_MAP != 0 {
		data, err = split(nfnl.FindU32(s.attrs, unix.NFTA_SET_DATA_TYPE))
	}
	return key, data, err
}

func typeNames(types []nft.Type) string {
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = t.Name
	}
	return strings.Join(names, " . ")
}

func hookName(n uint32) string {
	if n < 5 {
		return [...]string{"prerouting", "input", "forward", "output", "postrouting"}[n]
	}
	return strconv.Itoa(int(n))
}

func verdictText(code int32, chain string) string {
	switch code {
	case unix.NFT_JUMP:
		return "jump " + chain
	case unix.NFT_GOTO:
		return "goto " + chain
	case unix.NFT_RETURN:
		return "return"
	case 0:
		return "drop"
	case 1:
		return "accept"
	}
	return "verdict " + strconv.Itoa(int(code))
}
