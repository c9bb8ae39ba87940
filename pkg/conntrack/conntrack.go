// Package conntrack removes stale conntrack entries for host ports. A UDP or
// SCTP flow that started before the port was mapped keeps its old
// translation (often none) for as long as packets keep coming, so ADD, DEL
// and a repairing sync flush the entries whose original destination is a
// host port.
package conntrack

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/utils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Host is the real kernel's conntrack table, reached through netlink.
type Host struct{}

// Stale reports whether flows of proto outlive a rule change and need a
// flush: connectionless UDP, and SCTP. TCP flows end on their own.
func Stale(proto plan.Protocol) bool {
	return proto == plan.UDP || proto == plan.SCTP
}

// FlushDstPorts deletes the entries of family f whose protocol and
// original destination port are one of ports. The kernel walks its whole
// conntrack table once per request, whatever it matches, so all ports go
// in one request.
func (Host) FlushDstPorts(f plan.Family, ports []plan.ProtoPort) error {
	if len(ports) == 0 {
		return nil
	}
	var family netlink.InetFamily = unix.AF_INET
	if f == plan.IPv6 {
		family = unix.AF_INET6
	}
	filters := make([]netlink.CustomConntrackFilter, 0, len(ports))
	for _, pp := range ports {
		var num uint8 = utils.PROTOCOL_UDP
		if pp.Protocol == plan.SCTP {
			num = utils.PROTOCOL_SCTP
		}
		filter := &netlink.ConntrackFilter{}
		if err := filter.AddProtocol(num); err != nil {
			return err
		}
		if err := filter.AddPort(netlink.ConntrackOrigDstPort, uint16(pp.Port)); err != nil {
			return err
		}
		filters = append(filters, filter)
	}
	if _, err := netlinksafe.ConntrackDeleteFilters(netlink.ConntrackTable, family, filters...); err != nil {
		return fmt.Errorf("flush %s conntrack entries of %d host ports: %w", f, len(ports), err)
	}
	return nil
}
