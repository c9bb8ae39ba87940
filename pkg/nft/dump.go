package nft

import (
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// DumpTable dumps the family's objects of one kind (unix.NFT_MSG_GETCHAIN,
// GETRULE, GETSET) and returns the attributes of those of table, whose
// name the dump request carries for the kernel to filter by where it
// can.
func DumpTable(c Conn, f Family, kind int, table string) ([]nfnl.List, error) {
	// the table is the first attribute of a chain, a rule and a set
	const tableAttr = unix.NFTA_CHAIN_TABLE
	var req nfnl.Attrs
	req.String(tableAttr, table)
	msgs, err := c.Dump(nfnl.Msg{Type: nfnl.NftType(kind), Family: f.Proto(), Attrs: req.Bytes()})
	if err != nil {
		return nil, err
	}
	var out []nfnl.List
	for _, m := range msgs {
		attrs := nfnl.Parse(m.Attrs)
		for _, a := range attrs {
			if a.Type == tableAttr && a.String() == table {
				out = append(out, attrs)
				break
			}
		}
	}
	return out, nil
}
