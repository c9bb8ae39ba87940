package e2e

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/portmap-dev/portmap/test/nettest"
)

// udpFlow is one client UDP 5-tuple that keeps its source port, as a
// long-lived UDP client (DNS, QUIC, a game) does.
type udpFlow struct {
	conn net.PacketConn
	to   *net.UDPAddr
}

func newUDPFlow(t *testing.T, cl *nettest.Client, local, to string) *udpFlow {
	t.Helper()
	f := &udpFlow{}
	err := cl.NS.Do(func(ns.NetNS) error {
		var err error
		f.conn, err = net.ListenPacket("udp", local)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.conn.Close() })
	if f.to, err = net.ResolveUDPAddr("udp", to); err != nil {
		t.Fatal(err)
	}
	return f
}

// ask sends one datagram and returns the reply, or "" after a short wait.
func (f *udpFlow) ask(t *testing.T) string {
	t.Helper()
	if _, err := f.conn.WriteTo([]byte("hi\n"), f.to); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 200)
	_ = f.conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	n, _, err := f.conn.ReadFrom(buf)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(buf[:n]))
}

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
		v4 := newUDPFlow(t, cl, clientIP+":40001", addr(nodeIP, 6701))
		v6 := newUDPFlow(t, cl, addr(clientV6, 40001), addr(nodeIP6, 6701))
		for _, f := range []*udpFlow{v4, v6} {
			if got := f.ask(t); got != "" {
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
		for name, f := range map[string]*udpFlow{"ipv4": v4, "ipv6": v6} {
			want := fmt.Sprintf("u1 sees %s", map[string]string{"ipv4": clientIP, "ipv6": clientV6}[name])
			if got := f.ask(t); got != want {
				t.Errorf("%s: the flow that started before ADD got %q, want %q", name, got, want)
			}
		}
	})
}
