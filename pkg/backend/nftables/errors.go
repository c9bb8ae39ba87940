package nftables

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nft"
)

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
		errors.Is(err, nft.ErrRefused)
}
