package nodesafety

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	cnins "github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/test/nettest"
)

// hostile are host IPs a pod spec may name to reach the node's own
// traffic: none is the node's, so no path may serve them.
var hostile = []struct{ what, ip string }{
	{"another host's address", remoteIP},
	{"another node's address", otherNodeIP},
	{"the cloud metadata address (link-local)", metadataIP},
	{"another host's IPv6 address", remoteIP6},
}

// TestHostileHostIPs: a pod whose mappings name host IPs that are not the
// node's (another host's, another node's, the metadata address, IPv6,
// multicast, broadcast), and the wildcards 0.0.0.0 and ::, at the port the node itself talks to them on
// never receives the node's own connections, with either backend and
// with localhost served by NAT or by the socket path: the node's
// connect() and sendto() to each still reach the other host. The pod's
// wildcard mapping on the same ADD still serves the node (127.0.0.1, its
// own address), so the paths are on.
func TestHostileHostIPs(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		for _, localhost := range []string{"nat", "socket"} {
			t.Run(localhost, func(t *testing.T) { hostileHostIPs(t, backend, localhost, extra) })
		}
	})
}

func hostileHostIPs(t *testing.T, backend, localhost string, extra map[string]string) {
	cl := lan(t, 8090)
	var site *nettest.CgroupSite
	if localhost == "socket" {
		site = nettest.NewCgroupSite(t)
		extra["localhost"] = `"socket"`
		extra["cgroupPath"] = fmt.Sprintf("%q", site.Cgroup)
		extra["bpfPinDir"] = fmt.Sprintf("%q", site.PinDir)
	}
	rt := nettest.NewRuntime(t, nettest.Net{Name: "hostile", V4: "192.0.2.0/28", V6: "2001:db8:1:1::/64", Extra: extra})
	ms := []nettest.Mapping{{HostPort: 8091, ContainerPort: srvPort}}
	for _, h := range hostile {
		for _, proto := range []string{"tcp", "udp"} {
			ms = append(ms, nettest.Mapping{HostPort: 8090, ContainerPort: srvPort, Protocol: proto, HostIP: h.ip})
		}
	}
	// the wildcards of both families, spelled out: the node's addresses only
	ms = append(ms, nettest.Mapping{HostPort: 8090, ContainerPort: srvPort, Protocol: "udp", HostIP: "0.0.0.0"},
		nettest.Mapping{HostPort: 8090, ContainerPort: srvPort, Protocol: "udp", HostIP: "::"})
	ms = append(ms, nettest.Mapping{HostPort: 5353, ContainerPort: srvPort, Protocol: "udp", HostIP: "224.0.0.251"},
		nettest.Mapping{HostPort: 67, ContainerPort: srvPort, Protocol: "udp", HostIP: "255.255.255.255"},
		nettest.Mapping{HostPort: 8090, ContainerPort: srvPort, HostIP: "198.51.100.255"}) // the LAN's broadcast
	c := rt.MustAdd(t, "pod", ms...)
	nettest.Serve(t, c.NS, "pod", srvPort)

	// dial is the node's own client: a process in the socket path's
	// cgroup where it is on, else the test itself.
	dial := func(proto, to string) (string, error) {
		if site != nil {
			res, err := site.Client(proto, to, false)
			return res.Reply, err
		}
		return nettest.Dial(nil, proto, to)
	}
	for _, h := range hostile {
		for _, proto := range []string{"tcp", "udp"} {
			got, err := dial(proto, addr(h.ip, 8090))
			if err != nil || !strings.HasPrefix(got, "remote sees ") {
				t.Errorf("the node's %s to %s (%s): %q, %v; want the other host's answer", proto, addr(h.ip, 8090), h.what, got, err)
				continue
			}
			t.Logf("the node's %s to %s (%s, a hostIP of the pod's): answered by the other host", proto, addr(h.ip, 8090), h.what)
		}
	}
	for _, to := range []string{addr("127.0.0.1", 8091), addr(nodeIP, 8091)} {
		if got, err := dial("tcp", to); err != nil || !strings.HasPrefix(got, "pod sees ") {
			t.Errorf("the pod's wildcard mapping at %s: %q, %v; want the pod", to, got, err)
		}
	}
	// a remote client reaches the other host's addresses on the other
	// host, as ever (the node routes the metadata address to it)
	if got, err := nettest.Dial(cl.NS, "tcp", addr(remoteIP, 8090)); err != nil || !strings.HasPrefix(got, "remote sees ") {
		t.Errorf("the other host itself: %q, %v", got, err)
	}
	if site != nil {
		// nothing of the pod's hostile host IPs is in the socket maps
		out, stderr, status, err := nettest.Agent("list", "--json", "--bpf-pin-dir", site.PinDir)
		if err != nil || status != 0 {
			t.Fatalf("portmap-agent list: %d %v\n%s", status, err, stderr)
		}
		var entries []inventory.Entry
		if err := json.Unmarshal([]byte(out), &entries); err != nil {
			t.Fatalf("list --json: %v\n%s", err, out)
		}
		var served []string
		for _, e := range entries {
			if e.Backend != "localhost" {
				continue
			}
			served = append(served, fmt.Sprintf("%s:%d/%s", e.HostIP, e.HostPort, e.Protocol))
			if ip := net.ParseIP(e.HostIP); e.HostIP != "*" && (ip == nil || !ip.IsLoopback()) {
				t.Errorf("the socket path serves %s:%d/%s, which is not the node's", e.HostIP, e.HostPort, e.Protocol)
			}
		}
		if len(served) == 0 {
			t.Error("no socket path entry at all: the wildcard mapping's should be there")
		}
		t.Logf("socket path entries: %v, none at a host IP that is not the node's", served)
	}
	if err := rt.Check(c); err != nil {
		t.Errorf("CHECK: %v", err)
	}
}

// TestAddressThatMoves: a mapping whose hostIP is an address of the node
// (a /32 on its LAN interface: a VIP) serves the node's own connect() and
// sendto() to it; once the address moves to another host (the VIP fails
// over), the node's connections to it reach its new owner within a
// second, and once it comes back they reach the container again — with
// either backend, with localhost by NAT or by the socket path. The socket
// path serves loopback only and leaves the node's own addresses to the
// DNAT rules, which judge every packet by the addresses the node has
// then (before, the socket path kept the address's entry from ADD on,
// and the node's connections kept reaching the pod after the address
// left).
func TestAddressThatMoves(t *testing.T) {
	const vip, port = "198.51.100.10", 6720
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		for _, localhost := range []string{"nat", "socket"} {
			t.Run(localhost, func(t *testing.T) {
				cl := lan(t)
				var site *nettest.CgroupSite
				if localhost == "socket" {
					site = nettest.NewCgroupSite(t)
					extra["cgroupPath"] = fmt.Sprintf("%q", site.Cgroup)
					extra["bpfPinDir"] = fmt.Sprintf("%q", site.PinDir)
				}
				extra["localhost"] = fmt.Sprintf("%q", localhost)
				dial := func(proto string) (string, error) {
					if site != nil {
						res, err := site.Client(proto, addr(vip, port), false)
						return res.Reply, err
					}
					return nettest.Dial(nil, proto, addr(vip, port))
				}
				node := func(on bool) {
					t.Helper()
					ns := cl.NS                   // the other host
					from, to := "pmns0", "pmns0p" // the node's to the other host's
					if on {
						from, to = to, from
					}
					a, _ := netlink.ParseAddr(vip + "/32")
					move := func(ifName string, add bool) error {
						l, err := netlink.LinkByName(ifName)
						if err != nil {
							return err
						}
						if add {
							a.Flags = unix.IFA_F_NODAD
							return netlink.AddrAdd(l, a)
						}
						return netlink.AddrDel(l, a)
					}
					inOther := func(ifName string, add bool) error {
						if ifName == "pmns0p" {
							return ns.Do(func(cnins.NetNS) error { return move(ifName, add) })
						}
						return move(ifName, add)
					}
					if err := inOther(from, false); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
						t.Fatalf("remove %s from %s: %v", vip, from, err)
					}
					if err := inOther(to, true); err != nil {
						t.Fatalf("add %s to %s: %v", vip, to, err)
					}
				}
				node(true)
				rt := nettest.NewRuntime(t, nettest.Net{Name: "vip", V4: "192.0.2.224/28", Extra: extra})
				c := rt.MustAdd(t, "vip", nettest.Mapping{HostPort: port, ContainerPort: srvPort, Protocol: "tcp", HostIP: vip},
					nettest.Mapping{HostPort: port, ContainerPort: srvPort, Protocol: "udp", HostIP: vip})
				nettest.Serve(t, c.NS, "vip", srvPort)
				expect := func(when, who string) {
					t.Helper()
					for _, proto := range []string{"tcp", "udp"} {
						var got string
						var err error
						ok := nettest.Eventually(time.Second, func() bool {
							got, err = dial(proto)
							return err == nil && strings.HasPrefix(got, who+" sees ")
						})
						if !ok {
							t.Errorf("%s: the node's %s to %s: %q, %v; want %s's answer within 1 s", when, proto, addr(vip, port), got, err, who)
						}
					}
				}
				expect("the address the node's", "vip")
				node(false)
				serveRemote(t, cl.NS, port, vip) // its UDP socket binds the address
				expect("the address moved to another host", "remote")
				node(true)
				expect("the address back on the node", "vip")
				if err := rt.Check(c); err != nil {
					t.Errorf("CHECK: %v", err)
				}
				if err := rt.Del(c); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}
