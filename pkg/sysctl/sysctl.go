// Package sysctl finds the host interface that routes to a container and
// sets route_localnet on it, so that connections from 127.0.0.1 can be
// DNATed to the container and masqueraded (IPv4 only: IPv6 has no
// equivalent).
package sysctl

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Host is the real host.
type Host struct{}

// HostInterface returns the name of the interface the host routes ip
// through, or "" when no route leads there.
func (Host) HostInterface(ip net.IP) (string, error) {
	routes, err := netlink.RouteGet(ip)
	if err != nil {
		return "", fmt.Errorf("route to %s: %w", ip, err)
	}
	if len(routes) == 0 || routes[0].LinkIndex == 0 {
		return "", nil
	}
	// that link alone (net.InterfaceByIndex would dump every link: a
	// node's thousand veths on every ADD)
	l, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", nil // gone
	}
	return l.Attrs().Name, nil
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
	var routes []netlink.Route
	var err error
	for try := 0; try < 5; try++ {
		// the main table, cloned routes left out
		if routes, err = netlink.RouteList(nil, netlink.FAMILY_ALL); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list routes: %w", err)
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
			case r.LinkIndex == 0 || names[r.LinkIndex] == "": // multipath, unreachable, gone
				continue
			case r.Dst == nil:
				if (ip.To4() != nil) != (r.Family == unix.AF_INET) {
					continue
				}
			case r.Dst.Contains(ip):
				ones, _ = r.Dst.Mask.Size()
			default:
				continue
			}
			if ones > best {
				best, out[i] = ones, names[r.LinkIndex]
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
