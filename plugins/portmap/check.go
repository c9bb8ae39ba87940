package portmap

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Check verifies that every rule ADD made still exists, and that
// route_localnet is still on where ADD turned it on.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	c, err := ParseConfig(args.StdinData, args.IfName, p.DefaultBackend())
	if err != nil {
		return err
	}
	if c.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "missing prevResult: CHECK needs the result of ADD", "")
	}
	if !c.HasMappings {
		return nil
	}
	c.Request.Owner = owner(c, args)
	return cniError(c, p.check(c))
}

func (p *Plugin) check(c *Config) error {
	for _, f := range plan.Families {
		n := c.ContainerNets[f]
		if n == nil {
			continue
		}
		pl := plan.Build(c.Request, f, n)
		if pl.Empty() {
			continue
		}
		be, err := p.NewBackend(c.Backend, f)
		if err != nil {
			return err
		}
		if err := be.Check(pl); err != nil {
			return err
		}
		if pl.ForwardAccept {
			fw, err := p.forwarder(f)
			if err != nil {
				return err
			}
			if fw != nil {
				if err := fw.Check(pl); err != nil {
					return err
				}
			}
		}
		if !pl.LocalNet() {
			continue
		}
		ifName, err := p.Sysctl.HostInterface(n.IP)
		if err != nil || ifName == "" {
			continue // ADD set nothing either
		}
		on, err := p.Sysctl.RouteLocalnet(ifName)
		if err != nil {
			return err
		}
		if !on {
			return fmt.Errorf("net.ipv4.conf.%s.route_localnet is 0, want 1 (localhost connections to host ports would be dropped)", ifName)
		}
	}
	return nil
}
