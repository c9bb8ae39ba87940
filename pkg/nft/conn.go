package nft

import "github.com/portmap-dev/portmap/pkg/nfnl"

// Conn is what nf_tables is spoken through: a netlink socket
// (*nfnl.Conn) on a node, an in-memory nf_tables (nfttest.Kernel) in
// tests, which answers the same messages.
type Conn interface {
	Batch(msgs []nfnl.Msg, commit bool) error
	Get(reqs []nfnl.Msg) ([]nfnl.Reply, []error, error)
	GetOne(m nfnl.Msg) (nfnl.Reply, error)
	Dump(req nfnl.Msg) ([]nfnl.Reply, error)
	Writable(family uint8) error
}

// Scripter is a Conn that applies a transaction holding conditions
// itself (nfttest.Kernel: without them); through any other, nft -f of
// the transaction's text does.
type Scripter interface {
	Apply(tx *Tx, commit bool) error
}

// Commit applies tx through c as one batch or, without commit, has the
// kernel check it and keep nothing; a failure names the operation.
func Commit(c Conn, tx *Tx, commit bool) error {
	if tx.NeedsNft() {
		if s, ok := c.(Scripter); ok {
			return s.Apply(tx, commit)
		}
		return RunScript(tx.Text(), commit)
	}
	msgs, err := tx.Messages()
	if err != nil {
		return err
	}
	if err := c.Batch(msgs, commit); err != nil {
		return &Error{Op: tx.Describe(err), Err: err}
	}
	return nil
}
