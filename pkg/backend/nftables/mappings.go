package nftables

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Forwards reads back the host ports this family's cni_portmap table
// forwards, in one read; a missing table forwards nothing.
func (b *Backend) Mappings() ([]plan.Installed, error) {
	s, err := b.Kernel.Table(b.Family, Table)
	if err != nil {
		return nil, fmt.Errorf("read table: %w", err)
	}
	return forwardsOf(s), nil
}

// forwardsOf reads each dn- chain's owner from its comment (OwnerComment)
// and its mappings from its DNAT rules and their "hostport <key>"
// comments.
func forwardsOf(s *State) []plan.Installed {
	if s == nil {
		return nil
	}
	var fs []plan.Installed
	for _, name := range sortedChains(s) {
		c := s.Chains[name]
		if !strings.HasPrefix(name, "dn-") {
			continue
		}
		owner := plan.Owner{Network: plan.Unknown, ContainerID: plan.Unknown}
		if network, id, ok := c.owner(); ok {
			owner = plan.Owner{Network: network, ContainerID: id}
		}
		for _, r := range c.Rules {
			ks, ok := strings.CutPrefix(r.Comment, keyComment)
			if !ok || r.DNAT == "" {
				continue
			}
			k, ok := parseKey(ks)
			if !ok {
				continue
			}
			ip, port := net.ParseIP(r.DNAT), -1 // an address alone: the port stays
			if host, p, err := net.SplitHostPort(r.DNAT); err == nil {
				ip = net.ParseIP(host)
				port, _ = strconv.Atoi(p)
			}
			for h := k.Port; h <= k.last(); h++ {
				f := plan.Installed{HostIP: k.HostIP, HostPort: h, Protocol: k.Protocol, Owner: owner, ContainerIP: ip, ContainerPort: port}
				if port < 0 {
					f.ContainerPort = h
				}
				fs = append(fs, f)
			}
		}
	}
	return fs
}
