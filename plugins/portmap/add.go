package portmap

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Add forwards the mapped host ports to the container's addresses and
// prints the previous result back. It is all or nothing: when a step fails,
// what this ADD applied is removed before the error is returned.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	c, err := ParseConfig(args.StdinData, args.IfName, p.DefaultBackend())
	if err != nil {
		return err
	}
	if c.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig,
			"missing prevResult: portmap must be called as a chained plugin, after one that assigns the container's addresses", "")
	}
	if c.HasMappings {
		c.Request.Owner = owner(c, args)
		if err := p.add(c); err != nil {
			return cniError(c, err)
		}
	}
	res, err := c.PrevResult.GetAsVersion(c.CNIVersion)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("convert prevResult to %s: %v", c.CNIVersion, err), "")
	}
	return res.PrintTo(p.Stdout)
}

type applied struct {
	be interface{ Remove(*plan.Plan) error }
	pl *plan.Plan
	// forward marks the forwardAccept rules (no sysctl, no flush).
	forward bool
}

func (p *Plugin) add(c *Config) error {
	var done []applied
	undo := func(cause error) error {
		for _, a := range done {
			if err := a.be.Remove(a.pl); err != nil {
				fmt.Fprintf(p.Stderr, "portmap: undo %s after failed ADD: %v\n", a.pl.Family, err)
			}
		}
		return cause
	}
	var plans []*plan.Plan
	for _, f := range plan.Families {
		if n := c.ContainerNets[f]; n != nil {
			if pl := plan.Build(c.Request, f, n); !pl.Empty() {
				plans = append(plans, pl)
			}
		}
	}
	if c.Conflict == ConflictReject {
		if err := p.rejectConflicts(c, plans); err != nil {
			return err
		}
	}
	for _, pl := range plans {
		f := pl.Family
		be, err := p.NewBackend(c.Backend, f)
		if err != nil {
			return undo(err)
		}
		if err := be.Apply(pl); err != nil {
			return undo(err)
		}
		done = append(done, applied{be, pl, false})
		if pl.ForwardAccept {
			fw, err := p.forwarder(f)
			if err != nil {
				return undo(err)
			}
			if fw != nil {
				if err := fw.Apply(pl); err != nil {
					return undo(err)
				}
				done = append(done, applied{fw, pl, true})
			}
		}
	}
	for _, a := range done {
		if a.forward || !a.pl.LocalNet() {
			continue
		}
		ifName, err := p.Sysctl.HostInterface(a.pl.ContainerNet.IP)
		if err != nil || ifName == "" {
			// As upstream: without a route to the container only the
			// localhost case cannot work; remote clients still can.
			fmt.Fprintf(p.Stderr, "portmap: route_localnet not set, no host interface routes to %s: %v\n", a.pl.ContainerNet.IP, err)
			continue
		}
		if err := p.Sysctl.EnableRouteLocalnet(ifName); err != nil {
			return undo(err)
		}
	}
	// After the rules: new packets must meet the new translation.
	var flush []*plan.Plan
	for _, a := range done {
		if !a.forward {
			flush = append(flush, a.pl)
		}
	}
	p.flush(flush...)
	return nil
}
