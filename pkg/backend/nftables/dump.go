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
func dumpSet(c nft.Conn, f plan.Family, table, name string) ([]nfnl.Reply, error) {
	var el nfnl.Attrs
	el.String(unix.NFTA_SET_ELEM_LIST_TABLE, table).String(unix.NFTA_SET_ELEM_LIST_SET, name)
	return c.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETSETELEM), Family: nft.Family(f).Proto(), Attrs: el.Bytes()})
}

// dumpElements lists the elements of one map of the family's cni_portmap
// table; a missing map has none (a node set up before the interval maps).
func dumpElements(c nft.Conn, f plan.Family, name string) ([]Element, error) {
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
