package portmap

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/attach"
	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Add forwards the mapped host ports to the container's addresses and
// prints the previous result back. It is all or nothing: when a step fails,
// what this ADD applied is removed before the error is returned.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	a, err := p.load(args)
	if err != nil {
		return err
	}
	if a.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig,
			"missing prevResult: portmap must be called as a chained plugin, after one that assigns the container's addresses", "")
	}
	if err := p.add(a, args.Netns); err != nil {
		return cniError(a, err)
	}
	res, err := a.PrevResult.GetAsVersion(a.CNIVersion)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("convert prevResult to %s: %v", a.CNIVersion, err), "")
	}
	return res.PrintTo(p.Stdout)
}

// add applies the attachment's plans (none without mappings: then it only
// records the ADD, so that DEL has a record to forget).
func (p *Plugin) add(a *attach.Attachment, netnsPath string) error {
	plans := a.Plans
	if len(plans) > 0 {
		if err := p.strictForwardPorts(a); err != nil {
			return err
		}
	}
	if a.Conflict == attach.ConflictReject && len(plans) > 0 {
		if err := p.rejectConflicts(a); err != nil {
			return err
		}
	}
	type applied struct {
		s  backend.Stack
		pl *plan.Plan
	}
	stacks := make([]backend.Stack, len(plans))
	for i, pl := range plans {
		s, err := p.Host.Stack(a.Backend, pl.Family, &a.Request)
		if err != nil {
			return err
		}
		if err := s.LayersReady(pl); err != nil {
			return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
		}
		stacks[i] = s
	}
	if err := p.recordAdd(a, netnsPath); err != nil {
		return err
	}
	var done []applied
	undo := func(cause error) error {
		for _, d := range done {
			if err := d.s.Remove(d.pl); err != nil {
				fmt.Fprintf(p.Host.Log, "portmap: undo %s after failed ADD: %v\n", d.pl.Family, err)
			}
		}
		return cause
	}
	for i, pl := range plans {
		s := stacks[i]
		if err := s.Apply(pl); err != nil {
			return undo(err)
		}
		done = append(done, applied{s, pl})
	}
	for _, pl := range plans {
		if !pl.LocalNet() {
			continue
		}
		ifName, err := p.Host.Sysctl.HostInterface(pl.ContainerNet.IP)
		if err != nil || ifName == "" {
			// As upstream: without a route to the container only the
			// localhost case cannot work; remote clients still can.
			fmt.Fprintf(p.Host.Log, "portmap: route_localnet not set, no host interface routes to %s: %v\n", pl.ContainerNet.IP, err)
			continue
		}
		if err := p.Host.Sysctl.EnableRouteLocalnet(ifName); err != nil {
			return undo(err)
		}
	}
	// After the rules: new packets must meet the new translation.
	p.Host.Flush(plans...)
	return nil
}

// strictForwardPorts refuses host ports that firewalld would drop: with
// its StrictForwardPorts on (firewalld 2.3) it lets no connection through
// that other software DNATed, so a host port would look published and
// never answer. Asked before anything is written.
func (p *Plugin) strictForwardPorts(a *attach.Attachment) error {
	if p.Host.StrictForwardPorts == nil {
		return nil
	}
	strict, note, err := p.Host.StrictForwardPorts()
	if note != "" && p.Host.Log != nil {
		fmt.Fprintf(p.Host.Log, "portmap: %s\n", note)
	}
	if err != nil {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("cannot tell whether firewalld drops host ports: %v", err), "")
	}
	if !strict {
		return nil
	}
	return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf(
		"firewalld's StrictForwardPorts is on: it drops connections to host ports it did not forward itself, so host ports %s would never answer; "+
			"forward them in firewalld instead (a forward port or a policy to the container), or set StrictForwardPorts=no in firewalld.conf and reload firewalld",
		a.Request.Mappings.HostPorts()), "")
}
