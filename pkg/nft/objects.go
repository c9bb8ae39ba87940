package nft

import (
	"encoding/binary"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// Table is the transaction's table itself.
type Table struct{ Comment string }

// Chain is a chain of the table; with Base, a base chain on a hook.
type Chain struct {
	Name    string
	Comment string
	Base    *BaseChain
}

// BaseChain is where a base chain hooks in: nft's words for its type and
// hook, and the hook and priority as the kernel takes them.
type BaseChain struct {
	Type     string // nat, filter
	Hook     string // prerouting, output, postrouting, input
	HookNum  uint32 // NF_INET_*
	Priority int32
}

// Set is a named set of the table or, with Data, a map: its key a
// concatenation of types, its data one too or Verdict. Interval keys are
// ranges (a concatenation of ranges: the kernel picks the pipapo set).
type Set struct {
	Name     string
	Key      []Type
	Data     []Type
	Interval bool
}

// Rule is one rule: its chain, its statements and its comment; or, with
// Handle set, the rule to delete.
type Rule struct {
	Chain   string
	Stmts   []Stmt
	Comment string
	Handle  uint64
}

func (v *Table) Text(tx *Tx, vb Verb, b *strings.Builder) {
	tx.Head(b, vb, "table")
	if vb == Add || vb == Create {
		fmt.Fprintf(b, " { comment %q ; }", v.Comment)
	}
	b.WriteByte('\n')
}

func (v *Table) Encode(tx *Tx, vb Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWTABLE)
	if vb == Delete {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELTABLE)
	}
	a.String(unix.NFTA_TABLE_NAME, tx.TableName)
	if vb != Delete {
		a.Raw(attrTableUserdata, Comment(v.Comment))
	}
	return nil, nil
}

func (v *Chain) Text(tx *Tx, vb Verb, b *strings.Builder) {
	tx.Head(b, vb, "chain")
	b.WriteString(" " + v.Name)
	if (vb == Add || vb == Create) && (v.Base != nil || v.Comment != "") {
		b.WriteString(" {")
		if v.Base != nil {
			fmt.Fprintf(b, " type %s hook %s priority %d ;", v.Base.Type, v.Base.Hook, v.Base.Priority)
		}
		if v.Comment != "" {
			fmt.Fprintf(b, " comment %q ;", v.Comment)
		}
		b.WriteString(" }")
	}
	b.WriteByte('\n')
}

func (v *Chain) Encode(tx *Tx, vb Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	switch vb {
	case Flush: // nft's "flush chain" is a rule deletion without a handle
		m.Type = nfnl.NftType(unix.NFT_MSG_DELRULE)
		a.String(unix.NFTA_RULE_TABLE, tx.TableName)
		a.String(unix.NFTA_RULE_CHAIN, v.Name)
		return nil, nil
	case Delete:
		m.Type = nfnl.NftType(unix.NFT_MSG_DELCHAIN)
		a.String(unix.NFTA_CHAIN_TABLE, tx.TableName)
		a.String(unix.NFTA_CHAIN_NAME, v.Name)
		return nil, nil
	}
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWCHAIN)
	a.String(unix.NFTA_CHAIN_TABLE, tx.TableName)
	a.String(unix.NFTA_CHAIN_NAME, v.Name)
	if v.Base != nil {
		a.Nested(unix.NFTA_CHAIN_HOOK, func(a *nfnl.Attrs) {
			a.U32(unix.NFTA_HOOK_HOOKNUM, v.Base.HookNum)
			a.U32(unix.NFTA_HOOK_PRIORITY, uint32(v.Base.Priority))
		})
		a.String(unix.NFTA_CHAIN_TYPE, v.Base.Type)
	}
	if v.Comment != "" {
		a.Raw(AttrChainUserdata, Comment(v.Comment))
	}
	return nil, nil
}

// IsMap reports whether the set is a map.
func (v *Set) IsMap() bool { return len(v.Data) > 0 }

// TypeText is the set's type as nft declares it: "ipv4_addr .
// inet_service : verdict".
func (v *Set) TypeText() string {
	t := typeText(v.Key)
	if v.IsMap() {
		t += " : " + typeText(v.Data)
	}
	return t
}

func typeText(types []Type) string {
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = t.Name
	}
	return strings.Join(names, " . ")
}

func (v *Set) Text(tx *Tx, vb Verb, b *strings.Builder) {
	kind := "set"
	if v.IsMap() {
		kind = "map"
	}
	tx.Head(b, vb, kind)
	b.WriteString(" " + v.Name)
	if vb == Add || vb == Create {
		fmt.Fprintf(b, " { type %s ;", v.TypeText())
		if v.Interval {
			b.WriteString(" flags interval ;")
		}
		b.WriteString(" }")
	}
	b.WriteByte('\n')
}

func (v *Set) Encode(tx *Tx, vb Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	a.String(unix.NFTA_SET_TABLE, tx.TableName)
	a.String(unix.NFTA_SET_NAME, v.Name)
	if vb == Delete {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELSET)
		return nil, nil
	}
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSET)
	var flags uint32
	if v.IsMap() {
		flags |= unix.NFT_SET_MAP
	}
	concat := v.Interval && len(v.Key) > 1
	if v.Interval {
		flags |= unix.NFT_SET_INTERVAL
	}
	if concat {
		flags |= setConcat
	}
	a.U32(unix.NFTA_SET_FLAGS, flags)
	a.U32(unix.NFTA_SET_KEY_TYPE, ConcatType(v.Key...))
	a.U32(unix.NFTA_SET_KEY_LEN, ConcatLen(v.Key...))
	if v.IsMap() {
		a.U32(unix.NFTA_SET_DATA_TYPE, ConcatType(v.Data...))
		a.U32(unix.NFTA_SET_DATA_LEN, ConcatLen(v.Data...))
	}
	a.U32(unix.NFTA_SET_ID, tx.NextID())
	if concat {
		// a concatenation of ranges, as nft declares it: the kernel
		// picks the pipapo set, which needs each field's length
		a.Nested(unix.NFTA_SET_DESC, func(a *nfnl.Attrs) {
			a.Nested(attrSetDescConcat, func(a *nfnl.Attrs) {
				for _, t := range v.Key {
					a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) { a.U32(attrSetFieldLen, t.Len) })
				}
			})
		})
	}
	a.Raw(attrSetUserdata, setUserdata(byteorderBig))
	return nil, nil
}

// StmtText is the rule's statements as nft syntax: the rule without its
// chain and comment.
func (v *Rule) StmtText(f Family) string {
	parts := make([]string, 0, len(v.Stmts))
	for _, s := range v.Stmts {
		parts = append(parts, s.Text(f))
	}
	return strings.Join(parts, " ")
}

// NeedsNft reports whether a rule holds conditions in nft syntax, which
// only nft can compile.
func (tx *Tx) NeedsNft() bool {
	for _, o := range tx.ops {
		if r, ok := o.Obj.(*Rule); ok && r.NeedsNft() {
			return true
		}
	}
	return false
}

// NeedsNft reports whether a statement is conditions in nft syntax.
func (v *Rule) NeedsNft() bool {
	for _, s := range v.Stmts {
		if _, ok := s.(Conditions); ok {
			return true
		}
	}
	return false
}

func (v *Rule) Text(tx *Tx, vb Verb, b *strings.Builder) {
	tx.Head(b, vb, "rule")
	b.WriteString(" " + v.Chain)
	if v.Handle != 0 {
		fmt.Fprintf(b, " handle %d", v.Handle)
	}
	if vb == Add || vb == Create {
		b.WriteString(" " + v.StmtText(tx.Family))
		if v.Comment != "" {
			fmt.Fprintf(b, " comment %q", v.Comment)
		}
	}
	b.WriteByte('\n')
}

func (v *Rule) Encode(tx *Tx, _ Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	if v.Handle != 0 {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELRULE)
		a.String(unix.NFTA_RULE_TABLE, tx.TableName)
		a.String(unix.NFTA_RULE_CHAIN, v.Chain)
		a.Raw(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, v.Handle))
		return nil, nil
	}
	first, raw := v.Attrs(tx, a)
	if raw {
		return nil, fmt.Errorf("rule %q holds conditions in nft syntax: only nft compiles them", v.StmtText(tx.Family))
	}
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWRULE)
	m.Flags = unix.NLM_F_APPEND
	return first, nil
}

// Attrs writes the rule as the kernel gets it (NFTA_RULE_* attributes)
// and returns the messages its anonymous sets need first, and whether it
// holds conditions, which only nft can compile (their match is then
// missing from the attributes).
func (v *Rule) Attrs(tx *Tx, a *nfnl.Attrs) (first []nfnl.Msg, raw bool) {
	e := &Exprs{List: List{a}, Family: tx.Family, tx: tx}
	a.String(unix.NFTA_RULE_TABLE, tx.TableName)
	a.String(unix.NFTA_RULE_CHAIN, v.Chain)
	a.Nested(unix.NFTA_RULE_EXPRESSIONS, func(*nfnl.Attrs) {
		for _, s := range v.Stmts {
			s.Encode(e)
		}
	})
	for _, s := range e.anon {
		first = append(first, s.messages(tx.Family.Proto(), tx.TableName)...)
	}
	if v.Comment != "" {
		a.Raw(unix.NFTA_RULE_USERDATA, Comment(v.Comment))
	}
	return first, e.raw
}
