package nodesafety

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
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
		if out, stderr, status, err := podAgent(t, nettest.NewNode(t), "sync", "--cache-dir", rt.CacheDir); err != nil || status != 0 || !strings.Contains(out, "repaired") {
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

// pusher serves UDP port in namespace n: after the first datagram from a
// peer it sends "push" to that peer every 100 ms (a game server, a media
// stream, a QUIC server pushing), until the test ends.
func pusher(t *testing.T, n ns.NetNS, port int) {
	t.Helper()
	var pc net.PacketConn
	if err := n.Do(func(ns.NetNS) error {
		var err error
		pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 100)
		_, peer, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		for {
			if _, err := pc.WriteTo([]byte("push\n"), peer); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
}

// TestRepairKeepsRightFlows: a client on the LAN holds a connected UDP
// flow to a host port, and the container pushes to it every 100 ms. The
// firewall is flushed under it (the flow's conntrack entry keeps
// translating the pushes), and one `portmap-agent sync`, run as the
// DaemonSet runs it, repairs the rules: the client keeps receiving the pushes, with either backend. The
// repair's flush deletes only the flows the rules translate otherwise
// (before, it deleted this one, and every push after it left
// untranslated, from the container's address, which the client's
// connected socket drops: 0 of ~20). A flow that met no DNAT while the
// rules were missing is still flushed, and meets them after the repair.
func TestRepairKeepsRightFlows(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := lan(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "pushes", V4: "192.0.2.176/28", Extra: extra})
		c := rt.MustAdd(t, "pusher", nettest.Mapping{HostPort: 6710, ContainerPort: srvPort, Protocol: "udp"},
			nettest.Mapping{HostPort: 6711, ContainerPort: srvPort + 1, Protocol: "udp"})
		pusher(t, c.NS, srvPort)
		nettest.Serve(t, c.NS, "pusher", srvPort+1)

		var conn net.Conn
		if err := cl.NS.Do(func(ns.NetNS) error {
			var err error
			conn, err = net.Dial("udp", addr(nodeIP, 6710))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := conn.Write([]byte("hi\n")); err != nil {
			t.Fatal(err)
		}
		pushes := func(d time.Duration) int {
			n := 0
			buf := make([]byte, 100)
			for end := time.Now().Add(d); time.Now().Before(end); {
				_ = conn.SetReadDeadline(end)
				if k, err := conn.Read(buf); err == nil && strings.HasPrefix(string(buf[:k]), "push") {
					n++
				}
			}
			return n
		}
		if n := pushes(time.Second); n < 5 {
			t.Fatalf("the pushes before the flush: %d in 1 s, want about 10", n)
		}

		if backend == "nftables" {
			nettest.Run(t, "nft", "flush", "table", "ip", "cni_portmap")
		} else {
			nettest.Run(t, "iptables", "-t", "nat", "-F", "CNI-HOSTPORT-DNAT")
		}
		if n := pushes(time.Second); n < 5 {
			t.Fatalf("the pushes after the flush, before the repair: %d in 1 s, want about 10 (the entry translates them)", n)
		}
		// a flow that meets no DNAT while the rules are missing
		stale := nettest.NewUDPFlow(t, cl.NS, addr(remoteIP, 40011), addr(nodeIP, 6711))
		if got := stale.Ask(t); got != "" {
			t.Fatalf("host port 6711 answered %q with its rules flushed", got)
		}
		out, stderr, status, err := podAgent(t, nettest.NewNode(t), "sync", "--cache-dir", rt.CacheDir)
		if err != nil || status != 0 || !strings.Contains(out, "repaired") {
			t.Fatalf("sync after the flush: %d %v\n%s%s", status, err, out, stderr)
		}
		pushes(300 * time.Millisecond) // those sent before the repair, queued
		n := pushes(2 * time.Second)
		t.Logf("%s: %d pushes in the 2 s after the repair", backend, n)
		if n < 10 {
			t.Errorf("%d pushes reached the client in the 2 s after the repair, want about 20: the repair's flush deleted a flow that was right", n)
		}
		if got, want := stale.Ask(t), "pusher sees "+remoteIP; got != want {
			t.Errorf("the flow that met no DNAT while the rules were missing, after the repair: %q, want %q (flushed, so it meets them)", got, want)
		}
		if err := rt.Del(c); err != nil {
			t.Fatal(err)
		}
	})
}
