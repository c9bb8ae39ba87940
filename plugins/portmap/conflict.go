package portmap

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/attach"
)

// ErrHostPortInUse is the error code of a host port another attachment or
// a host process already has, under hostPortConflict "reject".
const ErrHostPortInUse uint = 101

// rejectConflicts returns a code-101 error naming the first mapping of the
// plans that another attachment or a host process already holds. The same
// port with another protocol, or another specific host IP, is no conflict;
// a wildcard and a specific host IP on one port are. It reads the host's
// whole host-port table: the price of the opt-in policy.
func (p *Plugin) rejectConflicts(a *attach.Attachment) error {
	for _, pl := range a.Plans {
		entries, err := p.Inventory.Mappings(pl.Family)
		if err != nil {
			return fmt.Errorf("read host ports: %w", err)
		}
		for m := range pl.Mappings.All() {
			host := "*"
			if m.HostIP != nil {
				host = m.HostIP.String()
			}
			proto := string(m.Protocol)
			for _, e := range entries {
				if !e.Overlaps(host, m.HostPort, proto) || (e.Network == a.Network && e.ContainerID == pl.Owner.ContainerID) {
					continue
				}
				return types.NewError(ErrHostPortInUse, fmt.Sprintf(
					"host port %s:%d/%s is already mapped by network %q container %q (%s backend, to %s:%d); hostPortConflict is \"reject\"",
					host, m.HostPort, proto, e.Network, e.ContainerID, e.Backend, e.ContainerIP, e.ContainerPort), "")
			}
			by, err := p.Inventory.Listener(proto, host, m.HostPort)
			if err != nil {
				return err
			}
			if by != "" {
				return types.NewError(ErrHostPortInUse, fmt.Sprintf(
					"host port %s:%d/%s is already in use: a process on the host listens on %s; hostPortConflict is \"reject\"",
					host, m.HostPort, proto, by), "")
			}
		}
	}
	return nil
}
