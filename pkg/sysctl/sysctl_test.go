package sysctl

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"

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

// parseRoute reads what HostInterfaces keeps of a route: its table (the
// attribute over the header's byte), a cloned route's flag, the output
// interface, the destination; a multipath route has no interface.
func TestParseRoute(t *testing.T) {
	msg := func(fam, dstLen, table uint8, flags uint32, attrs func(*nfnl.Attrs)) []byte {
		b := make([]byte, unix.SizeofRtMsg)
		b[0], b[1], b[4] = fam, dstLen, table
		binary.NativeEndian.PutUint32(b[8:], flags)
		var a nfnl.Attrs
		attrs(&a)
		return append(b, a.Bytes()...)
	}
	u32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	for _, tt := range []struct {
		name string
		b    []byte
		want route
		ok   bool
	}{
		{"short", []byte{2, 0}, route{}, false},
		{"v4 subnet", msg(unix.AF_INET, 24, unix.RT_TABLE_MAIN, 0, func(a *nfnl.Attrs) {
			a.Raw(unix.RTA_DST, []byte{198, 51, 100, 0})
			a.Raw(unix.RTA_OIF, u32(7))
		}), route{family: unix.AF_INET, table: unix.RT_TABLE_MAIN, oif: 7,
			dst: &net.IPNet{IP: net.IP{198, 51, 100, 0}, Mask: net.CIDRMask(24, 32)}}, true},
		{"v6 default, table by attribute", msg(unix.AF_INET6, 0, 0, 0, func(a *nfnl.Attrs) {
			a.Raw(unix.RTA_TABLE, u32(1000))
			a.Raw(unix.RTA_OIF, u32(3))
		}), route{family: unix.AF_INET6, table: 1000, oif: 3}, true},
		{"cloned multipath", msg(unix.AF_INET, 32, unix.RT_TABLE_MAIN, unix.RTM_F_CLONED, func(a *nfnl.Attrs) {
			a.Raw(unix.RTA_DST, []byte{192, 0, 2, 1})
			a.Raw(unix.RTA_MULTIPATH, make([]byte, 8))
		}), route{family: unix.AF_INET, table: unix.RT_TABLE_MAIN, cloned: true,
			dst: &net.IPNet{IP: net.IP{192, 0, 2, 1}, Mask: net.CIDRMask(32, 32)}}, true},
	} {
		got, ok := parseRoute(tt.b)
		if ok != tt.ok || got.family != tt.want.family || got.table != tt.want.table || got.cloned != tt.want.cloned ||
			got.oif != tt.want.oif || got.dst.String() != tt.want.dst.String() {
			t.Errorf("%s: %+v %v, want %+v %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

// linkName asks the kernel for one link by index; a missing one is "".
func TestLinkName(t *testing.T) {
	userns.Require(t)
	c, err := nfnl.OpenProtocol(unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if got := linkName(c, lo.Index); got != "lo" {
		t.Errorf("link %d: %q, want lo", lo.Index, got)
	}
	if got := linkName(c, 1<<30); got != "" {
		t.Errorf("a link that is not there: %q", got)
	}
}
