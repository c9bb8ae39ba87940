// Package nodesafety is the node-safety suite: what the plugin and its
// agent must never do to a node, tried as a hostile pod spec, a broken
// service or a wrong flag would try it, on the real kernel with real
// traffic, in namespaces of the suite's own (nettest.Main: the test
// binary's network and mount namespaces play the node).
//
//   - hostile host IPs: a mapping's hostIP that is not the node's
//     (another host's, link-local, multicast, broadcast, another node's)
//     never catches the node's own connections, on the NAT paths or the
//     socket path (hostip_test.go);
//   - the conntrack flush: the node's and its pods' flows to other hosts
//     on a host port's number survive ADD, DEL and the agent's repairs
//     (flush_test.go);
//   - missing evidence: a cache directory that is not there, holds no
//     entries or none of the owner's network, or whose entry of the owner
//     is cut short, prunes nothing (prune_test.go);
//   - the agent as the DaemonSet runs it: a cgroup namespace of its own,
//     the node's / as --root, the manifest's capabilities, the socket
//     path at its default sites (daemonset_test.go);
//   - a wedged system bus: ADD answers within its bound, and so does the
//     agent (bus_test.go).
//
// Each test logs what it tried and what stayed untouched.
//
// Address plan (documentation ranges):
//
//	the node's LAN  198.51.100.0/24, 2001:db8:2::/64  node .1/::1, another host .2/::2,
//	                                                  another node .3 (on that host)
//	metadata        169.254.169.254, on that host, routed by the node
//	containers      192.0.2.0/24 split per test, 2001:db8:1:N::/64
package nodesafety

import (
	"fmt"
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/portmap-dev/portmap/test/deploy"
	"github.com/portmap-dev/portmap/test/nettest"
)

func TestMain(m *testing.M) { nettest.Main(m) }

const (
	nodeIP      = "198.51.100.1"
	remoteIP    = "198.51.100.2" // another host on the node's LAN
	otherNodeIP = "198.51.100.3" // another node's address, on that host
	metadataIP  = "169.254.169.254"
	remoteIP6   = "2001:db8:2::2"
	srvPort     = 80
)

var backends = []string{"iptables", "nftables"}

// forBackends runs f once per backend, with the portmap keys that pick it.
func forBackends(t *testing.T, f func(t *testing.T, backend string, extra map[string]string)) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { f(t, b, map[string]string{"backend": fmt.Sprintf("%q", b)}) })
	}
}

func addr(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }

// daemonSetCaps are the capabilities the DaemonSet's agent runs with:
// the runtime's defaults and what deploy/portmap.yaml adds.
func daemonSetCaps(t *testing.T) []string {
	t.Helper()
	caps, err := deploy.AgentContainerCapabilities()
	if err != nil {
		t.Fatal(err)
	}
	return caps
}

// podAgent runs portmap-agent with args on node as the DaemonSet runs it
// (a cgroup namespace of its own, the node's / as --root, the manifest's
// capabilities).
func podAgent(t *testing.T, node *nettest.Node, args ...string) (stdout, stderr string, status int, err error) {
	t.Helper()
	return node.AgentAsPod(daemonSetCaps(t), args...)
}

// lan makes the node's LAN: a host at .2 that also holds another node's
// address and the metadata address (routed to it by the node), each
// answering on ports as "remote".
func lan(t *testing.T, ports ...int) *nettest.Client {
	t.Helper()
	cl := nettest.NewClient(t, nettest.ClientNet{HostIf: "pmns0", V4: "198.51.100", V6: "2001:db8:2:"})
	err := cl.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("pmns0p")
		if err != nil {
			return err
		}
		for _, a := range []string{otherNodeIP + "/24", metadataIP + "/32"} {
			addr, _ := netlink.ParseAddr(a)
			if err := netlink.AddrAdd(l, addr); err != nil {
				return fmt.Errorf("add %s: %w", a, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName("pmns0")
	if err != nil {
		t.Fatal(err)
	}
	_, dst, _ := net.ParseCIDR(metadataIP + "/32")
	route := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: net.ParseIP(remoteIP)}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatalf("route to %s: %v", metadataIP, err)
	}
	t.Cleanup(func() { _ = netlink.RouteDel(route) })
	for _, p := range ports {
		serveRemote(t, cl.NS, p, remoteIP, otherNodeIP, metadataIP, remoteIP6)
	}
	return cl
}

// serveRemote answers "remote sees <peer>" on port of namespace n: TCP on
// every address, UDP on each of ips with a socket bound to it, so that a
// reply comes from the address the datagram went to (a connected client
// takes no other).
func serveRemote(t *testing.T, n ns.NetNS, port int, ips ...string) {
	t.Helper()
	err := n.Do(func(ns.NetNS) error {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
				fmt.Fprintf(c, "remote sees %s\n", host)
				c.Close()
			}
		}()
		for _, ip := range ips {
			pc, err := net.ListenPacket("udp", addr(ip, port))
			if err != nil {
				return err
			}
			t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 1500)
				for {
					_, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					host, _, _ := net.SplitHostPort(from.String())
					_, _ = pc.WriteTo([]byte("remote sees "+host+"\n"), from)
				}
			}()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("serve the other host on %d: %v", port, err)
	}
}
