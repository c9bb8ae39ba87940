package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/test/nettest"
)

// podmanRange is what Podman passes for -p first-last:cfirst-clast/proto:
// one mapping per port.
func podmanRange(proto string, first, last, cfirst int) []nettest.Mapping {
	var out []nettest.Mapping
	for h := first; h <= last; h++ {
		out = append(out, nettest.Mapping{HostPort: h, ContainerPort: cfirst + h - first, Protocol: proto})
	}
	return out
}

// TestPortRange runs ADD through libcni with Podman-style ranges — 1000
// TCP ports forwarded to the same ports, 11 forwarded with an offset, 3
// UDP ports — and 9 single ports on the node's address, and sends real
// traffic to the first, a middle and the last port of each, from a
// client, from localhost and over IPv6; then CHECK and DEL. The ports
// with an offset, and those on an address, are many single mappings of
// one kind: nftables looks each kind up in a map of the chain's.
func TestPortRange(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		cl := client(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "range", Main: "ptp",
			V4: "192.0.2.0/27", V6: "2001:db8:1:1::/64", Extra: extra})
		var ms []nettest.Mapping
		ms = append(ms, podmanRange("tcp", 10000, 10999, 10000)...)
		ms = append(ms, podmanRange("tcp", 8000, 8010, 9000)...)
		ms = append(ms, podmanRange("udp", 5000, 5002, 5000)...)
		for i := range 9 {
			ms = append(ms, nettest.Mapping{HostPort: 7100 + 2*i, ContainerPort: 9005, Protocol: "tcp", HostIP: nodeIP})
		}
		c := rt.MustAdd(t, "c-range", ms...)
		for _, port := range []int{10000, 10500, 10999, 9000, 9005, 9010, 5000, 5002} {
			nettest.Serve(t, c.NS, fmt.Sprint("c", port), port)
		}
		for _, tc := range []struct {
			proto    string
			hostPort int
			server   string
		}{
			{"tcp", 10000, "c10000"}, {"tcp", 10500, "c10500"}, {"tcp", 10999, "c10999"},
			{"tcp", 8000, "c9000"}, {"tcp", 8005, "c9005"}, {"tcp", 8010, "c9010"},
			{"udp", 5000, "c5000"}, {"udp", 5002, "c5002"},
		} {
			expectReply(t, cl, tc.proto, addr(nodeIP, tc.hostPort), tc.server, clientIP)
			expectReply(t, cl, tc.proto, addr(nodeIP6, tc.hostPort), tc.server, clientV6)
			expectReply(t, nil, tc.proto, addr("127.0.0.1", tc.hostPort), tc.server, "")
		}
		for _, port := range []int{7100, 7108, 7116} {
			expectReply(t, cl, "tcp", addr(nodeIP, port), "c9005", clientIP)
		}
		// Ports next to the ranges are not forwarded, nor those on the
		// node's IPv4 address over IPv6.
		expectNoReply(t, cl, "tcp", addr(nodeIP, 7101))
		expectNoReply(t, cl, "tcp", addr(nodeIP6, 7100))
		expectNoReply(t, cl, "tcp", addr(nodeIP, 11000))
		expectNoReply(t, cl, "tcp", addr(nodeIP, 8011))
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK: %v", err)
		}
		if out := b.ruleset(t); !strings.Contains(out, "10000") {
			t.Errorf("ruleset shows no range:\n%s", out)
		}
		if err := rt.Del(c); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		expectNoReply(t, cl, "tcp", addr(nodeIP, 10500))
		expectNoReply(t, cl, "tcp", addr(nodeIP, 8005))
		expectNoReply(t, cl, "tcp", addr(nodeIP, 7108))
	})
}

// TestAllPorts is the boundary of a range: one container forwarding every
// TCP port, 1 to 65535, to the same port (65,535 mappings through libcni,
// as Podman sends -p 1-65535:1-65535). Traffic reaches the first, a
// middle and the last port from a client and over IPv6; CHECK passes;
// DEL leaves the ruleset as it was before the ADD.
func TestAllPorts(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		cl := client(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "allports", Main: "ptp",
			V4: "192.0.2.0/27", V6: "2001:db8:1:1::/64", Extra: extra})
		rt.MustAdd(t, "first", nettest.Mapping{HostPort: 7000, ContainerPort: srvPort, Protocol: "udp"})
		before := b.ruleset(t) // the node's shared rules in place
		c := rt.MustAdd(t, "c-all", podmanRange("tcp", 1, 65535, 1)...)
		for _, port := range []int{1, 32768, 65535} {
			nettest.Serve(t, c.NS, fmt.Sprint("c", port), port)
			expectReply(t, cl, "tcp", addr(nodeIP, port), fmt.Sprint("c", port), clientIP)
			expectReply(t, cl, "tcp", addr(nodeIP6, port), fmt.Sprint("c", port), clientV6)
		}
		expectNoReply(t, cl, "udp", addr(nodeIP, 32768))
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK: %v", err)
		}
		if err := rt.Del(c); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		expectNoReply(t, cl, "tcp", addr(nodeIP, 32768))
		if after := b.ruleset(t); after != before {
			t.Errorf("ruleset after DEL differs:\n--- before\n%s\n--- after\n%s", before, after)
		}
	})
}
