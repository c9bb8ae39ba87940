package iptables

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// Mappings reads back the host ports this family's nat table forwards —
// ours and the upstream plugin's, which share the layout — in one listing.
func (b *Backend) Mappings() ([]plan.Installed, error) {
	lines, err := b.Kernel.ListTable()
	if err != nil {
		return nil, fmt.Errorf("list table %s: %w", Table, err)
	}
	return parseMappings(lines), nil
}

// parseMappings reads `iptables -t nat -S` lines: the owner of each CNI-DN
// chain from its entry rule's comment (entryComment), the mappings from
// its DNAT rules.
func parseMappings(lines []string) []plan.Installed {
	lt := parseListing(lines)
	var out []plan.Installed
	for _, l := range lines {
		rest, ok := strings.CutPrefix(l, "-A "+dnChain)
		if !ok || !strings.Contains(rest, " -j DNAT ") {
			continue
		}
		chain := dnChain + rest[:strings.IndexByte(rest+" ", ' ')]
		r := xt.ParseRule(xt.SplitRule(l))
		owner := plan.Owner{Network: plan.Unknown, ContainerID: plan.Unknown}
		if o, ok := lt.owner(chain); ok {
			owner = o
		}
		var hostIP net.IP
		if r.Dst != "" {
			if ip, _, err := net.ParseCIDR(withPrefix(r.Dst)); err == nil {
				hostIP = ip
			}
		}
		ports, ok := xt.PortRange(r.Dport, ":")
		if !ok {
			continue
		}
		// A range rule stands for one mapping per port.
		for h := ports[0]; h <= ports[1]; h++ {
			f := plan.Installed{HostIP: hostIP, HostPort: h, Protocol: r.Proto, Owner: owner}
			if host, port, err := net.SplitHostPort(xt.ResolveDNAT(r.To, h)); err == nil {
				f.ContainerIP = net.ParseIP(host)
				f.ContainerPort, _ = strconv.Atoi(port)
			}
			out = append(out, f)
		}
	}
	return out
}
