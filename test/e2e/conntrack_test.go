package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/test/nettest"
)

// TestStaleUDPFlowMeetsNewRules: a UDP flow that reached the node before
// its port was mapped has a conntrack entry without DNAT; ADD flushes it
// (one walk of the conntrack table for both families), so the same flow's
// next datagram reaches the container, over IPv4 and IPv6.
func TestStaleUDPFlowMeetsNewRules(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := client(t)
		// A node with a mapping already has connection tracking on (a
		// namespace without NAT rules tracks nothing).
		rt := nettest.NewRuntime(t, nettest.Net{Name: "stale", V4: "192.0.2.0/28", V6: "2001:db8:1:60::/64", Extra: extra})
		rt.MustAdd(t, "other", nettest.Mapping{HostPort: 6702, ContainerPort: srvPort})
		v4 := nettest.NewUDPFlow(t, cl.NS, clientIP+":40001", addr(nodeIP, 6701))
		v6 := nettest.NewUDPFlow(t, cl.NS, addr(clientV6, 40001), addr(nodeIP6, 6701))
		for _, f := range []*nettest.UDPFlow{v4, v6} {
			if got := f.Ask(t); got != "" {
				t.Fatalf("an unmapped port answered %q", got)
			}
		}
		for _, fam := range []string{"ipv4", "ipv6"} {
			out, _ := exec.Command("conntrack", "-L", "-f", fam, "-p", "udp", "--dport", "6701").CombinedOutput()
			if !strings.Contains(string(out), "dport=6701") {
				t.Fatalf("no %s conntrack entry of the flow before ADD (the test would prove nothing):\n%s", fam, out)
			}
		}

		c := rt.MustAdd(t, "u1", nettest.Mapping{HostPort: 6701, ContainerPort: srvPort, Protocol: "udp"})
		nettest.Serve(t, c.NS, "u1", srvPort)
		for name, f := range map[string]*nettest.UDPFlow{"ipv4": v4, "ipv6": v6} {
			want := fmt.Sprintf("u1 sees %s", map[string]string{"ipv4": clientIP, "ipv6": clientV6}[name])
			if got := f.Ask(t); got != want {
				t.Errorf("%s: the flow that started before ADD got %q, want %q", name, got, want)
			}
		}
	})
}
