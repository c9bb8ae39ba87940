package netns

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Local reports whether the calling thread's namespace takes addr as its
// own: whether the kernel's route to it is of type local (the node's
// addresses, 127.0.0.0/8 and ::1, addresses a local route claims). That
// is what the DNAT rules' "fib daddr type local" and "--dst-type LOCAL"
// ask of every packet, so a host port is reached at exactly these
// addresses. A route that cannot be had (no route, no answer) is "not
// local", and so are the unspecified addresses, which the kernel routes
// as local but no packet is addressed to.
func Local(addr netip.Addr) bool {
	addr = addr.Unmap()
	if !addr.IsValid() || addr.IsUnspecified() {
		return false
	}
	routes, err := netlink.RouteGet(net.IP(addr.AsSlice()))
	return err == nil && len(routes) > 0 && routes[0].Type == unix.RTN_LOCAL
}
