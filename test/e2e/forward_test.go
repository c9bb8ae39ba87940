package e2e

import (
	"strings"
	"sync"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

// dropForward sets the FORWARD policy of both families to DROP in the
// node (the test's namespace), as Docker or a hardened host does, until
// the test ends.
func dropForward(t *testing.T) {
	for _, tool := range []string{"iptables", "ip6tables"} {
		nettest.Run(t, tool, "-P", "FORWARD", "DROP")
		t.Cleanup(func() { nettest.Run(t, tool, "-P", "FORWARD", "ACCEPT") })
	}
}

// TestForwardAccept: with FORWARD policy DROP, a host port fails; with
// forwardAccept it works (TCP and UDP, IPv4 and IPv6) while a direct
// connection to the container's address still fails; CHECK sees a
// missing accept; DEL removes it.
func TestForwardAccept(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := client(t)
		dropForward(t)

		plain := nettest.NewRuntime(t, nettest.Net{Name: "fwd-plain", V4: "192.0.2.0/28", V6: "2001:db8:1:50::/64", Extra: extra})
		c0 := plain.MustAdd(t, "c0", nettest.Mapping{HostPort: 6501, ContainerPort: srvPort})
		nettest.Serve(t, c0.NS, "c0", srvPort)
		expectNoReply(t, cl, "tcp", addr(nodeIP, 6501))

		withFA := map[string]string{"forwardAccept": "true"}
		for k, v := range extra {
			withFA[k] = v
		}
		rt := nettest.NewRuntime(t, nettest.Net{Name: "fwd", V4: "192.0.2.16/28", V6: "2001:db8:1:51::/64", Extra: withFA})
		c := rt.MustAdd(t, "c1", nettest.Mapping{HostPort: 6502, ContainerPort: srvPort},
			nettest.Mapping{HostPort: 6553, ContainerPort: srvPort, Protocol: "udp"})
		nettest.Serve(t, c.NS, "c1", srvPort)

		for _, x := range []struct{ proto, node, src string }{
			{"tcp", nodeIP, clientIP}, {"udp", nodeIP, clientIP}, {"tcp", nodeIP6, clientV6}, {"udp", nodeIP6, clientV6},
		} {
			port := 6502
			if x.proto == "udp" {
				port = 6553
			}
			expectReply(t, cl, x.proto, addr(x.node, port), "c1", x.src)
		}
		// Only the DNAT'd flows: the container's own address stays closed;
		// the other network did not ask.
		expectNoReplies(t, cl, []string{"tcp", addr(c.IP(4), srvPort)}, []string{"tcp", addr(c.IP(6), srvPort)},
			[]string{"udp", addr(c.IP(4), srvPort)}, []string{"tcp", addr(nodeIP, 6501)})

		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK: %v", err)
		}
		fw := iptables.AcceptChainName(plan.Owner{Network: "fwd", ContainerID: "c1", IfName: "eth0"})
		nettest.Run(t, "iptables", "-F", fw)
		if err := rt.Check(c); err == nil || !strings.Contains(err.Error(), "forwardAccept") {
			t.Errorf("CHECK after the accept rules were flushed: %v, want a forwardAccept error", err)
		}

		// A reload that empties the filter table but keeps the DROP
		// policy: sync puts the accept back.
		for _, tool := range []string{"iptables", "ip6tables"} {
			nettest.Run(t, tool, "-F")
		}
		expectNoReply(t, cl, "tcp", addr(nodeIP, 6502))
		r, status := runSync(t, "--cache-dir", rt.CacheDir)
		if st := states(r)["fwd/c1"]; status != 0 || st != "repaired" {
			t.Errorf("sync after a filter flush: exit %d, c1 %q, want repaired", status, st)
		}
		expectReply(t, cl, "tcp", addr(nodeIP, 6502), "c1", clientIP)
		expectReply(t, cl, "udp", addr(nodeIP6, 6553), "c1", clientV6)
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK after sync: %v", err)
		}
		if r, _ := runSync(t, "--cache-dir", rt.CacheDir); states(r)["fwd/c1"] != "ok" || len(r.Shared) != 0 {
			t.Errorf("second sync: %+v, want c1 ok and nothing shared to repair", r)
		}
		// A second jump to the chain: CHECK names it as a pass does, and
		// the pass leaves one.
		nettest.Run(t, "iptables", "-A", "CNI-HOSTPORT-FWD", "-j", fw)
		if err := rt.Check(c); err == nil || !strings.Contains(err.Error(), "2 jumps to "+fw) {
			t.Errorf("CHECK with a second jump: %v, want it named", err)
		}
		if r, _ := runSync(t, "--cache-dir", rt.CacheDir); states(r)["fwd/c1"] != "repaired" {
			t.Errorf("sync of a second jump: %+v, want c1 repaired", r)
		}
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK after that sync: %v", err)
		}

		if err := rt.Del(c); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		for _, tool := range []string{"iptables", "ip6tables"} {
			if out := nettest.Run(t, tool, "-S"); strings.Contains(out, "CNI-FW-") {
				t.Errorf("%s: DEL left forwardAccept rules:\n%s", tool, out)
			}
		}
	})
}

// expectNoReplies is expectNoReply for several (proto, address) at once,
// so the timeouts run side by side.
func expectNoReplies(t *testing.T, from *nettest.Client, targets ...[]string) {
	t.Helper()
	var wg sync.WaitGroup
	for _, x := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, err := nettest.Dial(from.NS, x[0], x[1]); err == nil {
				t.Errorf("%s to %s answered %q, want no answer", x[0], x[1], got)
			}
		}()
	}
	wg.Wait()
}
