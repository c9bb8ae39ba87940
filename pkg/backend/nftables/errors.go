package nftables

import (
	"errors"
	"fmt"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"golang.org/x/sys/unix"
)

// Error is a failed read or write of nf_tables: what it was, and why.
type Error struct {
	Op  string
	Err error
}

func (e *Error) Error() string { return e.Op + ": " + e.Err.Error() }

// IsNotFound reports whether err says that an object (a table, a chain, a
// map element) does not exist.
func IsNotFound(err error) bool { return errors.Is(err, unix.ENOENT) }

// describe names the operation a batch error is about.
func (tx *Tx) describe(err error) string {
	var ne *nfnl.Error
	if errors.As(err, &ne) {
		if ne.Index >= 0 && ne.Index < len(tx.msgOp) {
			i := tx.msgOp[ne.Index]
			one := &Tx{Family: tx.Family, Table: tx.Table, ops: tx.ops[i : i+1]}
			return strings.TrimSpace(one.Text())
		}
	}
	return fmt.Sprintf("%s transaction of %d operations", tx.Family, len(tx.ops))
}

// missed reports whether a fast path's batch failed the way it may when
// the node is not in the state it assumes, so the slow path runs: an
// object it creates exists or a key is held by another attachment
// (EEXIST: a re-ADD, a takeover), an object it uses is missing (ENOENT: a
// fresh node, a missing skeleton), or a chain it deletes is still
// referenced (EBUSY). Anything else — no permission, a batch too large —
// goes back to the caller. A kernel test holds the errnos to this. The
// iptables backend's word for the same is Missed.
func missed(err error) bool {
	return errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EBUSY) ||
		errors.Is(err, ErrNftRefused)
}
