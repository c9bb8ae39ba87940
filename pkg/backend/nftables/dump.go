package nftables

// Reads of a whole table (sync, GC, list): every chain, map and element
// in one dump of each kind.

import (
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// dumpSet dumps the elements of set name of the family's table.
func dumpSet(c *nfnl.Conn, f plan.Family, table, name string) ([]nfnl.Reply, error) {
	var el nfnl.Attrs
	el.String(unix.NFTA_SET_ELEM_LIST_TABLE, table).String(unix.NFTA_SET_ELEM_LIST_SET, name)
	return c.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETSETELEM), Family: uint8(nfproto(f)), Attrs: el.Bytes()})
}

// dumpElements lists the elements of one map of the family's cni_portmap
// table; a missing map has none (a node set up before the interval maps).
func dumpElements(c *nfnl.Conn, f plan.Family, name string) ([]Element, error) {
	msgs, err := dumpSet(c, f, Table, name)
	if nft.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, &nft.Error{Op: "list map " + name, Err: err}
	}
	var out []Element
	for _, m := range msgs {
		out = append(out, decodeElements(f, m.Attrs)...)
	}
	return out, nil
}

func (k *netlinkKernel) Table(f plan.Family, table string) (*State, error) {
	c, err := k.c()
	if err != nil {
		return nil, err
	}
	fam := uint8(nfproto(f))
	var get nfnl.Attrs
	get.String(unix.NFTA_TABLE_NAME, table)
	_, err = c.GetOne(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETTABLE), Family: fam, Attrs: get.Bytes()})
	if nft.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, &nft.Error{Op: "get table " + table, Err: err}
	}
	s := newState()
	chains, err := dumpOf(c, unix.NFT_MSG_GETCHAIN, fam, unix.NFTA_CHAIN_TABLE, table)
	if err != nil {
		return nil, &nft.Error{Op: "list chains", Err: err}
	}
	for _, attrs := range chains {
		ud, _ := find(attrs, nft.AttrChainUserdata)
		s.Chains[str(attrs, unix.NFTA_CHAIN_NAME)] = &ChainState{Comment: nft.CommentOf(ud)}
	}
	rules, err := dumpOf(c, unix.NFT_MSG_GETRULE, fam, unix.NFTA_RULE_TABLE, table)
	if err != nil {
		return nil, &nft.Error{Op: "list rules", Err: err}
	}
	for _, attrs := range rules {
		if cs := s.Chains[str(attrs, unix.NFTA_RULE_CHAIN)]; cs != nil {
			cs.Rules = append(cs.Rules, decodeAttrs(f, attrs))
		}
	}
	for _, cs := range s.Chains {
		if err := readDNATs(c, f, table, cs.Rules); err != nil {
			return nil, err
		}
		if table == Table {
			cs.splitRecord()
		}
	}
	sets, err := dumpOf(c, unix.NFT_MSG_GETSET, fam, unix.NFTA_SET_TABLE, table)
	if err != nil {
		return nil, &nft.Error{Op: "list maps", Err: err}
	}
	for _, attrs := range sets {
		name := str(attrs, unix.NFTA_SET_NAME)
		s.Maps[name] = true
		if table != Table {
			continue
		}
		if name == OwnersMap {
			msgs, err := dumpSet(c, f, table, name)
			if err != nil {
				return nil, &nft.Error{Op: "list map " + name, Err: err}
			}
			for _, m := range msgs {
				for _, ch := range decodeOwners(m.Attrs) {
					if cs := s.Chains[ch]; cs != nil {
						cs.Owned = true
					}
				}
			}
			continue
		}
		if _, _, ok := hairpinLength(name); ok {
			msgs, err := dumpSet(c, f, table, name)
			if err != nil {
				return nil, &nft.Error{Op: "list set " + name, Err: err}
			}
			for _, m := range msgs {
				s.Hairpins = append(s.Hairpins, decodeHairpins(f, m.Attrs)...)
			}
			continue
		}
		if !isDispatchMap(name) && !isDNATMap(name) {
			continue
		}
		els, err := dumpElements(c, f, name)
		if err != nil {
			return nil, err
		}
		for _, e := range els {
			s.Holders[e.Key.ID()] = e.Chain
			if e.Key.Flat {
				s.Targets[e.Key.ID()], s.Srcs[e.Key.ID()] = e.To, e.Srcs
			}
		}
	}
	return s, nil
}

// dumpOf dumps the family's objects of one kind (GETCHAIN, GETRULE,
// GETSET) and returns the attributes of those of table; tableAttr is the
// kind's table attribute, which also asks the kernel to filter where it
// can.
func dumpOf(c *nfnl.Conn, typ int, fam uint8, tableAttr uint16, table string) ([][]nfnl.Attr, error) {
	var req nfnl.Attrs
	req.String(tableAttr, table)
	msgs, err := c.Dump(nfnl.Msg{Type: nfnl.NftType(typ), Family: fam, Attrs: req.Bytes()})
	if err != nil {
		return nil, err
	}
	var out [][]nfnl.Attr
	for _, m := range msgs {
		if attrs := nfnl.Parse(m.Attrs); str(attrs, tableAttr) == table {
			out = append(out, attrs)
		}
	}
	return out, nil
}
