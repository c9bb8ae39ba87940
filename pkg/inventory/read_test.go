package inventory

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
)

func installed(port int, id string) plan.Installed {
	return plan.Installed{HostPort: port, Protocol: plan.TCP, ContainerIP: net.ParseIP("192.0.2.2").To4(), ContainerPort: 80,
		Owner: plan.Owner{Network: "net1", ContainerID: id}}
}

// Read merges every backend's and layer's mappings of both families,
// sorted; a placed layer is read at each site named once; a backend
// without its tools adds nothing and no error; one that fails adds its
// error after the rest is read.
func TestRead(t *testing.T) {
	site := &plan.Request{Localhost: plan.LocalhostSocket, Socket: plan.Socket{PinDir: "/run/pins"}}
	for _, tt := range []struct {
		name     string
		failOpen map[string]error
		sites    []*plan.Request
		ports    string // host port/backend, in order
		opens    int    // opens of the localhost layer
		err      string
	}{
		{name: "all", ports: "80/localhost 8080/iptables 8443/nftables 9000/nftables", opens: 2},
		{name: "a site twice and the default", sites: []*plan.Request{site, site, {}}, ports: "80/localhost 80/localhost 8080/iptables 8443/nftables 9000/nftables", opens: 4},
		{name: "iptables not installed", failOpen: map[string]error{"iptables": fmt.Errorf("ipv4: %w", backend.ErrNotInstalled)},
			ports: "80/localhost 8443/nftables 9000/nftables", opens: 2},
		{name: "nftables fails", failOpen: map[string]error{"nftables": errors.New("netlink: permission denied")},
			ports: "80/localhost 8080/iptables", opens: 2, err: "netlink: permission denied"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, fh := fakehost.New()
			fh.FailOpen = tt.failOpen
			fh.Installed = map[string][]plan.Installed{
				"iptables ipv4":  {installed(8080, "c1")},
				"nftables ipv4":  {installed(9000, "c2")},
				"nftables ipv6":  {installed(8443, "c3")},
				"localhost ipv4": {installed(80, "c4")},
			}
			es, err := Read(h, tt.sites...)
			var got []string
			for _, e := range es {
				got = append(got, fmt.Sprintf("%d/%s", e.HostPort, e.Backend))
			}
			if strings.Join(got, " ") != tt.ports || (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("Read: %q, %v; want %q, %q", got, err, tt.ports, tt.err)
			}
			if n := strings.Count(fh.Calls(), "layer localhost"); n != tt.opens {
				t.Errorf("localhost opened %d times, want %d:\n%s", n, tt.opens, fh.Calls())
			}
		})
	}
}

// OnHost answers the "reject" policy from the same table, one family.
func TestOnHost(t *testing.T) {
	h, fh := fakehost.New()
	fh.Installed = map[string][]plan.Installed{"iptables ipv4": {installed(8080, "c1")}, "nftables ipv6": {installed(8443, "c3")}}
	es, err := OnHost{h}.Mappings(plan.IPv4)
	if err != nil || len(es) != 1 || es[0].HostPort != 8080 {
		t.Errorf("Mappings(ipv4) = %+v, %v; want 8080 alone", es, err)
	}
}

// Listener finds a listening TCP socket and a bound UDP socket of this
// namespace (the test's own, on loopback), not a connected UDP socket,
// not another address or port, and nothing for SCTP.
func TestListener(t *testing.T) {
	if os.Getenv("PORTMAP_QEMU_USER") != "" {
		t.Skip("qemu-user does not emulate NETLINK_SOCK_DIAG")
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	tport := tl.Addr().(*net.TCPAddr).Port
	ul, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	uport := ul.LocalAddr().(*net.UDPAddr).Port
	uc, err := net.Dial("udp", ul.LocalAddr().String()) // connected: takes only its peer's packets
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	cport := uc.LocalAddr().(*net.UDPAddr).Port
	t6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatalf("IPv6 loopback: %v", err)
	}
	defer t6.Close()
	t6port := t6.Addr().(*net.TCPAddr).Port
	for _, tt := range []struct {
		proto, ip string
		port      int
		want      string
	}{
		{"tcp", "*", t6port, fmt.Sprintf("[::1]:%d", t6port)},
		{"tcp", "::1", t6port, fmt.Sprintf("[::1]:%d", t6port)},
		{"tcp", "127.0.0.1", t6port, ""},
		{"tcp", "*", tport, fmt.Sprintf("127.0.0.1:%d", tport)},
		{"tcp", "127.0.0.1", tport, fmt.Sprintf("127.0.0.1:%d", tport)},
		{"tcp", "192.0.2.1", tport, ""},
		{"udp", "*", uport, fmt.Sprintf("127.0.0.1:%d", uport)},
		{"udp", "*", cport, ""},
		{"tcp", "*", uport, ""},
		{"sctp", "*", tport, ""},
	} {
		got, err := Listener(tt.proto, tt.ip, tt.port)
		if err != nil {
			t.Fatalf("Listener(%s, %s, %d): %v", tt.proto, tt.ip, tt.port, err)
		}
		if got != tt.want {
			t.Errorf("Listener(%s, %s, %d) = %q, want %q", tt.proto, tt.ip, tt.port, got, tt.want)
		}
	}
}
