package nftables

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// The kinds of object a transaction writes, each with its two spellings
// (nft text for the golden files and nft, netlink attributes for the
// kernel; a kernel test holds the two equal for every plan shape) and, in
// memory.go, what applying it does to the in-memory kernel.

func (v tableObj) nft(*Tx) knftables.Object {
	return &knftables.Table{Comment: knftables.PtrTo(v.comment)}
}

func (v tableObj) encode(tx *Tx, _ verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWTABLE)
	a.String(unix.NFTA_TABLE_NAME, tx.Table)
	a.Raw(nftaTableUserdata, comment(v.comment))
	return nil, nil
}

func (v chainObj) nft(*Tx) knftables.Object {
	c := &knftables.Chain{Name: v.name}
	if v.comment != "" {
		c.Comment = knftables.PtrTo(v.comment)
	}
	if v.base != nil {
		c.Type, c.Hook, c.Priority = knftables.PtrTo(v.base.typ), knftables.PtrTo(v.base.hook), knftables.PtrTo(v.base.priority)
	}
	return c
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

func (v mapObj) nft(tx *Tx) knftables.Object {
	m := &knftables.Map{Name: v.name, Type: mapType(tx.Family, v.addr)}
	if v.interval {
		m.Flags = []knftables.SetFlag{knftables.IntervalFlag}
	}
	return m
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

func (v elemObj) nft(*Tx) knftables.Object {
	e := &knftables.Element{Map: v.key.Map(), Key: v.key.Fields()}
	if v.chain != "" {
		e.Value = []string{"goto " + v.chain}
	}
	return e
}

func (v elemObj) encode(tx *Tx, vb verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSETELEM)
	if vb == opDelete {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELSETELEM)
	}
	elementAttrs(a, tx.Table, v.key, v.chain)
	return nil, nil
}

func (v *Rule) nft(tx *Tx) knftables.Object {
	r := &knftables.Rule{Chain: v.Chain, Rule: v.Text(tx.Family)}
	if v.Comment != "" {
		r.Comment = knftables.PtrTo(v.Comment)
	}
	if v.Handle != 0 {
		r.Handle = knftables.PtrTo(int(v.Handle))
	}
	return r
}

func (v *Rule) encode(tx *Tx, _ verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	if v.Handle != 0 {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELRULE)
		a.String(unix.NFTA_RULE_TABLE, tx.Table)
		a.String(unix.NFTA_RULE_CHAIN, v.Chain)
		a.Raw(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, v.Handle))
		return nil, nil
	}
	first, ra, raw := v.attrs(tx)
	if raw {
		return nil, fmt.Errorf("rule %q holds conditions in nft syntax: only nft compiles them", v.Text(tx.Family))
	}
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWRULE)
	*a = ra
	m.Flags = unix.NLM_F_APPEND
	return first, nil
}
