package nftables

import (
	"fmt"
	"maps"
	"slices"
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
	flat := map[string][]Key{} // by chain: its flat keys
	for _, id := range slices.Sorted(maps.Keys(s.Targets)) {
		if k, ok := keyFromID(id); ok {
			flat[s.Holders[id]] = append(flat[s.Holders[id]], k)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Chains)) {
		c := s.Chains[name]
		if !strings.HasPrefix(name, "dn-") {
			continue
		}
		owner := plan.Owner{Network: plan.Unknown, ContainerID: plan.Unknown}
		if network, id, ok := c.owner(); ok {
			owner = plan.Owner{Network: network, ContainerID: id}
		}
		for _, k := range flat[name] {
			ip, port := target(s.Targets[k.ID()])
			fs = append(fs, plan.Installed{HostIP: k.HostIP, HostPort: k.Port, Protocol: k.Protocol,
				Owner: owner, ContainerIP: ip, ContainerPort: port})
		}
		for _, r := range c.Rules {
			for _, d := range r.DNATs {
				ip, port := target(d.To)
				fs = append(fs, plan.Installed{HostIP: d.Key.HostIP, HostPort: d.Key.Port, Protocol: d.Key.Protocol,
					Owner: owner, ContainerIP: ip, ContainerPort: port})
			}
			ks, ok := strings.CutPrefix(r.Comment, keyComment)
			if !ok || r.DNAT == "" {
				continue
			}
			k, ok := parseKey(ks)
			if !ok {
				continue
			}
			ip, port := target(r.DNAT)
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
