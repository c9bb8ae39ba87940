package nodesafety

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"

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
