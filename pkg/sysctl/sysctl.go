// Package sysctl finds the host interface that routes to a container and
// sets route_localnet on it, so that connections from 127.0.0.1 can be
// DNATed to the container and masqueraded (IPv4 only: IPv6 has no
// equivalent).
package sysctl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// Host is the real host.
type Host struct{}

// HostInterface returns the name of the interface the host routes ip
// through, or "" when no route leads there.
func (Host) HostInterface(ip net.IP) (string, error) {
	c, err := nfnl.OpenProtocol(unix.NETLINK_ROUTE)
	if err != nil {
		return "", err
	}
	defer c.Close()
	fam, addr, bits := uint8(unix.AF_INET), ip.To4(), uint8(32)
	if addr == nil {
		fam, addr, bits = unix.AF_INET6, ip.To16(), 128
	}
	req := make([]byte, unix.SizeofRtMsg)
	req[0], req[1] = fam, bits
	var a nfnl.Attrs
	a.Raw(unix.RTA_DST, addr)
	reply, err := c.Exec(unix.RTM_GETROUTE, append(req, a.Bytes()...))
	if err != nil {
		return "", fmt.Errorf("route to %s: %w", ip, err)
	}
	r, ok := parseRoute(reply)
	if !ok || r.oif == 0 {
		return "", nil
	}
	return linkName(c, r.oif), nil
}

// linkName is the name of link index, asked for that link alone
// (net.InterfaceByIndex would dump every link: a node's thousand veths
// on every ADD); "" when it is gone.
func linkName(c *nfnl.Conn, index int) string {
	req := make([]byte, unix.SizeofIfInfomsg) // struct ifinfomsg: family, pad, type, index, …
	binary.NativeEndian.PutUint32(req[4:], uint32(index))
	reply, err := c.Exec(unix.RTM_GETLINK, req)
	if err != nil || len(reply) < unix.SizeofIfInfomsg {
		return ""
	}
	name, ok := nfnl.Find(reply[unix.SizeofIfInfomsg:], unix.IFLA_IFNAME)
	if !ok {
		return ""
	}
	return nfnl.Attr{Value: name}.String()
}

// route is what a routing table entry says that matters here.
type route struct {
	family uint8
	dst    *net.IPNet // nil: the default route
	table  uint32
	cloned bool
	oif    int // 0: none (a multipath or unreachable route)
}

// parseRoute reads an RTM_NEWROUTE body: rtmsg, then attributes.
func parseRoute(b []byte) (route, bool) {
	if len(b) < unix.SizeofRtMsg {
		return route{}, false
	}
	r := route{family: b[0], table: uint32(b[4]), cloned: binary.NativeEndian.Uint32(b[8:12])&unix.RTM_F_CLONED != 0}
	dstLen := int(b[1])
	for a := range nfnl.All(b[unix.SizeofRtMsg:]) {
		switch a.Type {
		case unix.RTA_TABLE:
			if len(a.Value) >= 4 {
				r.table = binary.NativeEndian.Uint32(a.Value)
			}
		case unix.RTA_OIF:
			if len(a.Value) >= 4 {
				r.oif = int(binary.NativeEndian.Uint32(a.Value))
			}
		case unix.RTA_DST:
			if len(a.Value) == 4 || len(a.Value) == 16 {
				r.dst = &net.IPNet{IP: net.IP(a.Value), Mask: net.CIDRMask(dstLen, 8*len(a.Value))}
			}
		}
	}
	return r, true
}

// HostInterfaces is HostInterface for many addresses, with one dump of
// the main routing table and of the links instead of two requests per
// address: the interface of the most specific route to each, "" where
// none leads (a sync pass looks up every cached container at once).
//
// A dump that a concurrent change interrupted (a runtime adding or
// removing a container's veth meanwhile: the agent's passes run beside
// one) is retried; after a few tries what it returned is used — an
// address whose route or link it lacks gets "", and the next pass looks
// again.
func (Host) HostInterfaces(ips []net.IP) ([]string, error) {
	c, err := nfnl.OpenProtocol(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msgs, err := c.DumpRaw(unix.RTM_GETROUTE, make([]byte, unix.SizeofRtMsg)) // AF_UNSPEC: both families
	if err != nil && !errors.Is(err, nfnl.ErrInterrupted) {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var routes []route
	for _, m := range msgs {
		if r, ok := parseRoute(m); ok && r.table == unix.RT_TABLE_MAIN && !r.cloned && r.oif != 0 {
			routes = append(routes, r)
		}
	}
	links, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Index] = l.Name
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		best := -1
		for _, r := range routes {
			ones := 0
			switch {
			case r.dst == nil:
				if (ip.To4() != nil) != (r.family == unix.AF_INET) {
					continue
				}
			case r.dst.Contains(ip):
				ones, _ = r.dst.Mask.Size()
			default:
				continue
			}
			if ones > best && names[r.oif] != "" {
				best, out[i] = ones, names[r.oif]
			}
		}
	}
	return out, nil
}

func localnetKey(ifName string) string {
	return "net/ipv4/conf/" + ifName + "/route_localnet"
}

// EnableRouteLocalnet sets net.ipv4.conf.<ifName>.route_localnet=1.
func (Host) EnableRouteLocalnet(ifName string) error {
	if _, err := sysctl.Sysctl(localnetKey(ifName), "1"); err != nil {
		return fmt.Errorf("enable route_localnet on %q: %w", ifName, err)
	}
	return nil
}

// RouteLocalnet reports whether route_localnet is on for ifName.
func (Host) RouteLocalnet(ifName string) (bool, error) {
	v, err := sysctl.Sysctl(localnetKey(ifName))
	if err != nil {
		return false, fmt.Errorf("read route_localnet of %q: %w", ifName, err)
	}
	return strings.TrimSpace(v) == "1", nil
}
