// Package e2e runs real conflists through libcni — the real ptp or bridge
// and host-local plugins, then our portmap — and sends real TCP and UDP
// traffic between namespaces. The whole binary runs in a network namespace
// of its own (nettest.Main); that namespace plays the node.
//
// Address plan (documentation ranges):
//
//	client link   198.51.100.0/24, 2001:db8:2::/64   node .1/::1, client .2/::2
//	second node address 198.51.100.10 (hostIP tests)
//	containers    192.0.2.0/24 split per test, 2001:db8:1:N::/64
package e2e

import (
	"testing"

	"github.com/portmap-dev/portmap/test/nettest"
)

func TestMain(m *testing.M) { nettest.Main(m) }
