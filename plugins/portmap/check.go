package portmap

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/attach"
)

// Check verifies that every rule ADD made still exists, and that
// route_localnet is still on where ADD turned it on.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	a, err := p.load(args)
	if err != nil {
		return err
	}
	if a.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "missing prevResult: CHECK needs the result of ADD", "")
	}
	if !a.HasMappings {
		return nil
	}
	return cniError(a, p.check(a))
}

func (p *Plugin) check(a *attach.Attachment) error {
	for _, pl := range a.Plans {
		s, err := p.Host.Stack(a.Backend, pl.Family, &a.Request)
		if err != nil {
			return err
		}
		if err := s.Check(pl); err != nil {
			return err
		}
		if !pl.LocalNet() {
			continue
		}
		ifName, err := p.Host.Sysctl.HostInterface(pl.ContainerNet.IP)
		if err != nil || ifName == "" {
			continue // ADD set nothing either
		}
		on, err := p.Host.Sysctl.RouteLocalnet(ifName)
		if err != nil {
			return err
		}
		if !on {
			return fmt.Errorf("net.ipv4.conf.%s.route_localnet is 0, want 1 (localhost connections to host ports would be dropped)", ifName)
		}
	}
	return nil
}
