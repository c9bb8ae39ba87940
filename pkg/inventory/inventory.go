// Package inventory is the host-port table of this host: the mappings both
// backends read back from the kernel (ours, and the upstream plugin's
// iptables layout, which has the same names), merged and sorted, for
// `portmap-agent list` and the "reject" host-port conflict policy. Each backend
// parses what it writes; this package only merges.
package inventory

import (
	"sort"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Entry is one forwarded host port, as `portmap-agent list --json` prints it.
type Entry struct {
	HostIP        string `json:"hostIP"` // "*" for every address
	HostPort      int    `json:"hostPort"`
	Protocol      string `json:"protocol"`
	ContainerIP   string `json:"containerIP"`
	ContainerPort int    `json:"containerPort"`
	Network       string `json:"network"`
	ContainerID   string `json:"containerID"`
	Backend       string `json:"backend"`
}

// FromInstalled turns a backend's read-back mappings into entries.
func FromInstalled(fs []plan.Installed, backend string) []Entry {
	out := make([]Entry, 0, len(fs))
	for _, f := range fs {
		e := Entry{HostIP: "*", HostPort: f.HostPort, Protocol: string(f.Protocol), ContainerPort: f.ContainerPort,
			Network: f.Owner.Network, ContainerID: f.Owner.ContainerID, Backend: backend}
		if f.HostIP != nil {
			e.HostIP = f.HostIP.String()
		}
		if f.ContainerIP != nil {
			e.ContainerIP = f.ContainerIP.String()
		}
		out = append(out, e)
	}
	return out
}

// Overlaps reports whether e and the mapping (hostIP, port, proto) would
// catch the same packets: same protocol and port, and host IPs that are
// equal or of which one is "*".
func (e Entry) Overlaps(hostIP string, port int, proto string) bool {
	return e.HostPort == port && e.Protocol == proto &&
		(e.HostIP == "*" || hostIP == "*" || e.HostIP == hostIP)
}

// Sort orders entries by host port, protocol, host IP and owner.
func Sort(es []Entry) {
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if a.HostPort != b.HostPort {
			return a.HostPort < b.HostPort
		}
		if a.Protocol != b.Protocol {
			return a.Protocol < b.Protocol
		}
		if a.HostIP != b.HostIP {
			return a.HostIP < b.HostIP
		}
		if a.Network+a.ContainerID != b.Network+b.ContainerID {
			return a.Network+a.ContainerID < b.Network+b.ContainerID
		}
		return a.ContainerIP < b.ContainerIP
	})
}
