package sysctl

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/portmap-dev/portmap/test/userns"
)

// The tests run in a user and network namespace of their own (no root
// needed): they address its loopback and turn route_localnet on there.
func TestMain(m *testing.M) { userns.Main(m) }

// The interface that routes to a container, one address at a time and
// many at once (the most specific route; "" where none leads), and its
// route_localnet switch.
func TestHost(t *testing.T) {
	userns.Require(t)
	// The namespace's own loopback, with a test network on it: no
	// module to load, nothing else to make.
	link, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("192.0.2.1/24")
	if err := netlink.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	_, dst, _ := net.ParseCIDR("198.51.100.0/24")
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst}); err != nil {
		t.Fatal(err)
	}
	var h Host
	if name, err := h.HostInterface(net.ParseIP("192.0.2.2")); err != nil || name != "lo" {
		t.Errorf("HostInterface(192.0.2.2) = %q, %v", name, err)
	}
	if _, err := h.HostInterface(net.ParseIP("203.0.113.9")); err == nil {
		t.Error("HostInterface of an address no route leads to: nil error")
	}
	names, err := h.HostInterfaces([]net.IP{net.ParseIP("198.51.100.7"), net.ParseIP("203.0.113.9"), net.ParseIP("2001:db8::1")})
	if err != nil || len(names) != 3 || names[0] != "lo" || names[1] != "" || names[2] != "" {
		t.Errorf("HostInterfaces = %q, %v", names, err)
	}
	if on, err := h.RouteLocalnet("lo"); on || err != nil {
		t.Fatalf("route_localnet of a new interface: %v, %v", on, err)
	}
	if err := h.EnableRouteLocalnet("lo"); err != nil {
		t.Fatal(err)
	}
	if on, err := h.RouteLocalnet("lo"); !on || err != nil {
		t.Errorf("route_localnet after enabling: %v, %v", on, err)
	}
	if err := h.EnableRouteLocalnet("none0"); err == nil {
		t.Error("route_localnet of a missing interface: nil error")
	}
	if _, err := h.RouteLocalnet("none0"); err == nil {
		t.Error("route_localnet read of a missing interface: nil error")
	}
}
