package portmap

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Del removes what the attachment owns in both families. It is idempotent
// and needs neither prevResult nor portMappings: without them the backend
// finds the attachment's objects by their owner-derived names.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	a, err := p.load(args)
	if err != nil {
		return err
	}
	if err := p.recordDel(a); errors.Is(err, lock.ErrTimeout) {
		// Nothing removed, "try again later": a DEL that removed the
		// rules without its record would leave the ADD on record, and
		// a pass that read the cache entry before the runtime removed
		// it would bring the rules back. The runtime retries DEL.
		return cniError(a, err)
	} else if err != nil {
		// A ledger that cannot be written (a read-only /run): the rules
		// go all the same, or DEL would fail for as long as it lasts.
		fmt.Fprintf(p.Host.Log, "portmap: %v\n", err)
	}
	var errs, missing []error
	var flush []*plan.Plan
	usable := 0
	for _, f := range plan.Families {
		s, err := p.Host.Stack(a.Backend, f, &a.Request)
		if host.NotInstalled(err) {
			// No tools for this family: nothing of it can exist.
			missing = append(missing, err)
			continue
		}
		if err != nil {
			return cniError(a, err)
		}
		usable++
		pl := a.Plan(f)
		if err := s.Remove(pl); err != nil {
			errs = append(errs, err)
			continue
		}
		// The conntrack walk costs the same whatever it finds: skip a
		// family the container had no address of (when DEL is told).
		if a.PrevResult == nil || a.ContainerNets[f] != nil {
			flush = append(flush, pl)
		}
	}
	p.Host.FlushRemoved(flush...)
	if usable == 0 {
		return cniError(a, fmt.Errorf("no family's tools are on PATH: %w", errors.Join(missing...)))
	}
	return cniError(a, errors.Join(errs...))
}
