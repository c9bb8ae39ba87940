package nftables

import (
	"encoding/binary"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// The kinds of object a transaction writes, each with its two spellings
// (nft text for the golden files and nft, written as knftables writes it,
// which a test holds; netlink attributes for the kernel, which a kernel
// test holds equal to nft's for every plan shape) and, in memkernel_test.go, what
// applying it does to the in-memory kernel.

// head writes the start of every command: "add chain ip cni_portmap".
func head(b *strings.Builder, tx *Tx, v verb, kind string) {
	fmt.Fprintf(b, "%s %s %s %s", v, kind, nftFamily(tx.Family), tx.Table)
}

func (v tableObj) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "table")
	if vb == opAdd || vb == opCreate {
		fmt.Fprintf(b, " { comment %q ; }", v.comment)
	}
	b.WriteByte('\n')
}

func (v tableObj) encode(tx *Tx, _ verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWTABLE)
	a.String(unix.NFTA_TABLE_NAME, tx.Table)
	a.Raw(nftaTableUserdata, comment(v.comment))
	return nil, nil
}

func (v chainObj) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "chain")
	b.WriteString(" " + v.name)
	if (vb == opAdd || vb == opCreate) && (v.base != nil || v.comment != "") {
		b.WriteString(" {")
		if v.base != nil {
			fmt.Fprintf(b, " type %s hook %s priority %d ;", v.base.typ, v.base.hook, v.base.prio)
		}
		if v.comment != "" {
			fmt.Fprintf(b, " comment %q ;", v.comment)
		}
		b.WriteString(" }")
	}
	b.WriteByte('\n')
}

func (v chainObj) encode(tx *Tx, vb verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	switch vb {
	case opFlush: // nft's "flush chain" is a rule deletion without a handle
		m.Type = nfnl.NftType(unix.NFT_MSG_DELRULE)
		a.String(unix.NFTA_RULE_TABLE, tx.Table)
		a.String(unix.NFTA_RULE_CHAIN, v.name)
		return nil, nil
	case opDelete:
		m.Type = nfnl.NftType(unix.NFT_MSG_DELCHAIN)
		a.String(unix.NFTA_CHAIN_TABLE, tx.Table)
		a.String(unix.NFTA_CHAIN_NAME, v.name)
		return nil, nil
	}
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWCHAIN)
	a.String(unix.NFTA_CHAIN_TABLE, tx.Table)
	a.String(unix.NFTA_CHAIN_NAME, v.name)
	if v.base != nil {
		a.Nested(unix.NFTA_CHAIN_HOOK, func(a *nfnl.Attrs) {
			a.U32(unix.NFTA_HOOK_HOOKNUM, v.base.hookNum)
			a.U32(unix.NFTA_HOOK_PRIORITY, uint32(v.base.prio))
		})
		a.String(unix.NFTA_CHAIN_TYPE, string(v.base.typ))
	}
	if v.comment != "" {
		a.Raw(nftaChainUserdata, comment(v.comment))
	}
	return nil, nil
}

func (v mapObj) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "map")
	b.WriteString(" " + v.name)
	if vb == opAdd || vb == opCreate {
		fmt.Fprintf(b, " { type %s ;", mapType(tx.Family, v.addr))
		if v.interval {
			b.WriteString(" flags interval ;")
		}
		b.WriteString(" }")
	}
	b.WriteByte('\n')
}

func (v mapObj) encode(tx *Tx, _ verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSET)
	tx.nextID++
	keyType := concatType(typeInetProto, typeInetService)
	keyLen := uint32(8)
	fields := []uint32{1, 2} // the fields' lengths: protocol, port
	if v.addr {
		at, al := uint32(typeIPv4Addr), uint32(4)
		if tx.Family == plan.IPv6 {
			at, al = typeIPv6Addr, 16
		}
		keyType, keyLen = concatType(at, typeInetProto, typeInetService), al+8
		fields = append([]uint32{al}, fields...)
	}
	flags := uint32(unix.NFT_SET_MAP)
	if v.interval {
		// a concatenation of ranges, as nft declares it: the kernel picks
		// the pipapo set, which needs each field's length
		flags |= unix.NFT_SET_INTERVAL | nftSetConcat
	}
	a.String(unix.NFTA_SET_TABLE, tx.Table)
	a.String(unix.NFTA_SET_NAME, v.name)
	a.U32(unix.NFTA_SET_FLAGS, flags)
	a.U32(unix.NFTA_SET_KEY_TYPE, keyType)
	a.U32(unix.NFTA_SET_KEY_LEN, keyLen)
	a.U32(unix.NFTA_SET_DATA_TYPE, dataVerdict)
	if v.interval {
		a.U32(unix.NFTA_SET_DATA_LEN, 0)
	}
	a.U32(unix.NFTA_SET_ID, tx.nextID)
	if v.interval {
		a.Nested(unix.NFTA_SET_DESC, func(a *nfnl.Attrs) {
			a.Nested(nftaSetDescConcat, func(a *nfnl.Attrs) {
				for _, l := range fields {
					a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) { a.U32(nftaSetFieldLen, l) })
				}
			})
		})
	}
	a.Raw(nftaSetUserdata, setUserdata(byteorderBig))
	return nil, nil
}

func (v elemObj) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "element")
	fmt.Fprintf(b, " %s { %s", v.key.Map(), strings.Join(v.key.Fields(), " . "))
	switch {
	case vb == opDelete || v.chain == "":
	case v.key.Flat:
		ip, port := target(v.to)
		fmt.Fprintf(b, " comment %q : %s . %d", flatComment(v.chain, v.srcs), ip, port)
	default:
		b.WriteString(" : goto " + v.chain)
	}
	b.WriteString(" }\n")
}

func (v elemObj) encode(tx *Tx, vb verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSETELEM)
	if vb == opDelete {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELSETELEM)
	}
	chain := v.chain
	if vb == opDelete {
		chain = ""
	}
	elementAttrs(a, tx.Family, tx.Table, v.key, chain, v.to, v.srcs...)
	return nil, nil
}

func (v *Rule) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "rule")
	b.WriteString(" " + v.Chain)
	if v.Handle != 0 {
		fmt.Fprintf(b, " handle %d", v.Handle)
	}
	if vb == opAdd || vb == opCreate {
		b.WriteString(" " + v.Text(tx.Family))
		if v.Comment != "" {
			fmt.Fprintf(b, " comment %q", v.Comment)
		}
	}
	b.WriteByte('\n')
}

func (v *Rule) encode(tx *Tx, _ verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	if v.Handle != 0 {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELRULE)
		a.String(unix.NFTA_RULE_TABLE, tx.Table)
		a.String(unix.NFTA_RULE_CHAIN, v.Chain)
		a.Raw(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, v.Handle))
		return nil, nil
	}
	first, raw := v.attrs(tx, a)
	if raw {
		return nil, fmt.Errorf("rule %q holds conditions in nft syntax: only nft compiles them", v.Text(tx.Family))
	}
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWRULE)
	m.Flags = unix.NLM_F_APPEND
	return first, nil
}
