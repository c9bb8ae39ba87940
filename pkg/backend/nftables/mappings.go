package nftables

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Mappings reads back the host ports this family's cni_portmap table
// forwards, in one read; a missing table forwards nothing.
func (b *Backend) Mappings() ([]plan.Installed, error) {
	s, err := b.Kernel.Table(b.Family, Table)
	if err != nil {
		return nil, fmt.Errorf("read table: %w", err)
	}
	return mappingsOf(s), nil
}

// mappingsOf reads each dn- chain's owner from its comment (ownerComment)
// and its mappings from the flat elements naming it, its rules' DNAT maps
// and its DNAT rules with their "hostport <key>" comments.
func mappingsOf(s *State) []plan.Installed {
	if s == nil {
		return nil
	}
	var fs []plan.Installed
	flat := map[string][]Key{} // by chain: its flat keys
	for _, k := range slices.SortedFunc(maps.Keys(s.Elements), compareKeys) {
		if k.Flat {
			flat[s.Elements[k].Chain] = append(flat[s.Elements[k].Chain], k)
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
			to := s.Elements[k].To
			ip, port := ipOf(to.Addr()), int(to.Port())
			fs = append(fs, plan.Installed{HostIP: ipOf(k.HostIP), HostPort: k.Port, Protocol: k.Protocol,
				Owner: owner, ContainerIP: ip, ContainerPort: port})
		}
		for _, r := range c.Rules {
			for _, d := range r.DNATs {
				fs = append(fs, plan.Installed{HostIP: ipOf(d.Key.HostIP), HostPort: d.Key.Port, Protocol: d.Key.Protocol,
					Owner: owner, ContainerIP: ipOf(d.To.Addr()), ContainerPort: int(d.To.Port())})
			}
			ks, ok := strings.CutPrefix(r.Comment, keyComment)
			dnat, isDNAT := nft.StmtOf[nft.DNAT](r.Rule)
			if !ok || !isDNAT {
				continue
			}
			k, ok := parseKey(ks)
			if !ok {
				continue
			}
			to := dnat.To
			for h := k.Port; h <= k.last(); h++ {
				f := plan.Installed{HostIP: ipOf(k.HostIP), HostPort: h, Protocol: k.Protocol, Owner: owner, ContainerIP: ipOf(to.Addr()), ContainerPort: int(to.Port())}
				if to.Port() == 0 { // an identity range: the port stays
					f.ContainerPort = h
				}
				fs = append(fs, f)
			}
		}
	}
	return fs
}
