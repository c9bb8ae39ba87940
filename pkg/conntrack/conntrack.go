// Package conntrack removes stale conntrack entries for host ports. A UDP or
// SCTP flow that started before the port was mapped keeps its old
// translation (often none) for as long as packets keep coming, so ADD and
// DEL flush the entries whose original destination is the host port.
package conntrack

import (
	"fmt"

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

// FlushDstPort deletes the entries of family f and proto whose original
// destination port is port.
func (Host) FlushDstPort(f plan.Family, proto plan.Protocol, port int) error {
	var family netlink.InetFamily = unix.AF_INET
	if f == plan.IPv6 {
		family = unix.AF_INET6
	}
	var num uint8 = utils.PROTOCOL_UDP
	if proto == plan.SCTP {
		num = utils.PROTOCOL_SCTP
	}
	if err := utils.DeleteConntrackEntriesForDstPort(uint16(port), num, family); err != nil {
		return fmt.Errorf("flush %s conntrack entries for %s port %d: %w", f, proto, port, err)
	}
	return nil
}
