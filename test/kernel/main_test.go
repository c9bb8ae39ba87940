// Package kernel tests the iptables backend on the real kernel, inside a
// network namespace of its own (nettest.Main): apply, check, remove,
// re-ADD, shared-IP ownership, upstream leftovers and the one-process
// steady state.
package kernel

import (
	"testing"

	"github.com/portmap-dev/portmap/test/nettest"
)

func TestMain(m *testing.M) { nettest.Main(m) }
