package nodesafety

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/test/nettest"
)

// flowIDs lists the node's conntrack entries of UDP flows to dst:port by
// their original source. (A flow's next datagram would make a deleted
// entry again: read it before asking.)
func flowIDs(t *testing.T, dst string, port uint16) map[string]bool {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range flows {
		if f.Forward.Protocol == unix.IPPROTO_UDP && f.Forward.DstIP.Equal(net.ParseIP(dst)) && f.Forward.DstPort == port {
			out[fmt.Sprintf("%s:%d", f.Forward.SrcIP, f.Forward.SrcPort)] = true
		}
	}
	return out
}

// TestFlushKeepsOtherHostsFlows: the node's own UDP flow to another host
// on port 4433 (a QUIC client's) and a pod's, masqueraded by the node,
// keep their conntrack entries through ADD and DEL of host port 4433/udp
// and through the agent's repair of it, with either backend: the flush
// deletes only flows addressed to the node. A flow that reached the
// node's 4433 before the port was mapped is still flushed, so it meets
// the new DNAT (TestStaleUDPFlowMeetsNewRules in test/e2e tells the
// same for both families).
func TestFlushKeepsOtherHostsFlows(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := lan(t, 4433)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "flush", V4: "192.0.2.16/28", V6: "2001:db8:1:2::/64", Extra: extra})
		// a node with a mapping tracks connections
		pod := rt.MustAdd(t, "client-pod", nettest.Mapping{HostPort: 6702, ContainerPort: srvPort})

		node := nettest.NewUDPFlow(t, nil, addr(nodeIP, 40001), addr(remoteIP, 4433))
		podFlow := nettest.NewUDPFlow(t, pod.NS, ":40002", addr(remoteIP, 4433))
		stale := nettest.NewUDPFlow(t, cl.NS, addr(remoteIP, 40003), addr(nodeIP, 4433))
		for name, f := range map[string]*nettest.UDPFlow{"the node's": node, "the pod's": podFlow} {
			if got := f.Ask(t); !strings.HasPrefix(got, "remote sees ") {
				t.Fatalf("%s flow to the other host: %q", name, got)
			}
		}
		if got := stale.Ask(t); got != "" {
			t.Fatalf("the node's unmapped 4433 answered %q", got)
		}
		outbound := flowIDs(t, remoteIP, 4433)
		if len(outbound) != 2 || len(flowIDs(t, nodeIP, 4433)) != 1 {
			t.Fatalf("conntrack before ADD: outbound %v, inbound %v; want the two outbound flows and the stale one (the test would prove nothing)",
				outbound, flowIDs(t, nodeIP, 4433))
		}
		kept := func(when string) {
			t.Helper()
			if got := flowIDs(t, remoteIP, 4433); fmt.Sprint(got) != fmt.Sprint(outbound) {
				t.Errorf("%s: the outbound flows to %s are %v, were %v: a flow to another host was flushed", when, addr(remoteIP, 4433), got, outbound)
				return
			}
			for name, f := range map[string]*nettest.UDPFlow{"the node's": node, "the pod's": podFlow} {
				if got := f.Ask(t); !strings.HasPrefix(got, "remote sees ") {
					t.Errorf("%s: %s flow to the other host: %q", when, name, got)
				}
			}
			t.Logf("%s: the node's and the pod's flows to %s kept (from %v)", when, addr(remoteIP, 4433), outbound)
		}

		c := rt.MustAdd(t, "quic", nettest.Mapping{HostPort: 4433, ContainerPort: srvPort, Protocol: "udp"})
		nettest.Serve(t, c.NS, "quic", srvPort)
		kept("after ADD of 4433/udp")
		if got, want := stale.Ask(t), "quic sees "+remoteIP; got != want {
			t.Errorf("the flow that reached the node's 4433 before ADD: %q, want %q (flushed, so it meets the DNAT)", got, want)
		}

		// the agent's repair flushes the repaired ports too
		nettest.ResetNAT(t)
		if out, stderr, status, err := nettest.Agent("sync", "--cache-dir", rt.CacheDir); err != nil || status != 0 || !strings.Contains(out, "repaired") {
			t.Fatalf("sync after the nat table was emptied: %d %v\n%s%s", status, err, out, stderr)
		}
		kept("after the agent's repair")

		if err := rt.Del(c); err != nil {
			t.Fatal(err)
		}
		kept("after DEL")
		if out, err := exec.Command("conntrack", "-L", "-p", "udp", "--dport", "4433").CombinedOutput(); err == nil {
			t.Logf("conntrack at the end:\n%s", out)
		}
	})
}
