package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/test/nettest"
)

// TestLocalhostGuard: route_localnet on the container-facing interface must
// not let a container reach what the host binds to 127.0.0.1, while the
// host's own localhost -> host port forwarding keeps working. The test
// first shows the attack works with the guard removed, so it can fail.
func TestLocalhostGuard(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		rt := nettest.NewRuntime(t, nettest.Net{Name: "guard", V4: "192.0.2.0/27", Extra: extra})
		c := rt.MustAdd(t, "g", nettest.Mapping{HostPort: 7800, ContainerPort: srvPort})
		nettest.Serve(t, c.NS, "g", srvPort)

		// A host service on 127.0.0.1 only.
		ln, err := net.Listen("tcp4", "127.0.0.1:7801")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(conn, "host-secret sees", conn.RemoteAddr())
				conn.Close()
			}
		}()

		// The container sends to 127.0.0.1 through its gateway, as a
		// container with CAP_NET_RAW or a neighbour could.
		gw := c.Result.IPs[0].Gateway
		err = c.NS.Do(func(ns.NetNS) error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			// Without 127.0.0.1 on lo, 127.0.0.1 is no longer local here.
			lo127, _ := netlink.ParseAddr("127.0.0.1/8")
			if err := netlink.AddrDel(lo, lo127); err != nil {
				return err
			}
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			for _, k := range []string{"all", "eth0"} {
				if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+k+"/route_localnet", []byte("1"), 0o644); err != nil {
					return err
				}
			}
			_, dst, _ := net.ParseCIDR("127.0.0.1/32")
			return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: dst, Gw: gw})
		})
		if err != nil {
			t.Fatalf("route 127.0.0.1 via the gateway in the container: %v", err)
		}

		restore := removeGuard(t, b.name)
		if got, err := nettest.Dial(c.NS, "tcp", "127.0.0.1:7801"); err != nil {
			t.Fatalf("without the guard the attack should work (else this test proves nothing): %v", err)
		} else {
			t.Logf("without the guard: %q", got)
		}
		restore()

		if got, err := nettest.Dial(c.NS, "tcp", "127.0.0.1:7801"); err == nil {
			t.Errorf("the container reached the host's 127.0.0.1 service: %q", got)
		}
		expectReply(t, nil, "tcp", addr("127.0.0.1", 7800), "g", "")
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK: %v", err)
		}
	})
}

// removeGuard takes out the guard of both backends (an earlier subtest's
// stays on the node) and returns how to put back the one under test (a
// re-ADD would too, but this keeps the test to the guard alone).
func removeGuard(t *testing.T, backend string) func() {
	_ = exec.Command("iptables", "-t", "filter", "-D", "INPUT", "-j", iptables.GuardChain).Run()
	_ = exec.Command("nft", "flush", "chain", "ip", nftables.Table, nftables.GuardChain).Run()
	if backend == "iptables" {
		return func() { nettest.Run(t, "iptables", "-t", "filter", "-I", "INPUT", "1", "-j", iptables.GuardChain) }
	}
	return func() {
		nettest.Run(t, "nft", "add", "rule", "ip", nftables.Table, nftables.GuardChain,
			`iifname != "lo" ip daddr 127.0.0.0/8 ct state != { established, related } ct status & dnat == 0 drop`)
	}
}
