// Package kernel tests both backends on the real kernel, inside a network
// namespace of its own (nettest.Main): apply, check, remove, re-ADD,
// shared-IP ownership, upstream leftovers, the one-process (iptables) and
// no-process (nftables) steady states, the iptables marker chains, the
// netlink writer held to nft's objects, and the real binary under races,
// SIGKILL and bad input.
package kernel

import (
	"testing"

	"github.com/portmap-dev/portmap/test/nettest"
)

func TestMain(m *testing.M) { nettest.Main(m) }
