package agent

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/caps"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// A pass's writing half: the attachments it keeps are grouped into units
// (a backend or layer of one family), each converged on its own, and
// route_localnet is set where an IPv4 attachment needs it (sync.go reads
// and admits what the units get).

// unit is one backend or layer of one family, and which attachments it
// keeps.
type unit struct {
	name string // in the report
	f    plan.Family
	want func(*wanted) bool
	open func() (backend.Backend, error)
}

// units are one per backend and family (each attachment's configured
// backend), and one per layer, site and family (the attachments whose
// configuration turns it on, whatever backend maps them): the default
// site, the sites the attachments name and the extra ones.
func (a *Agent) units(ws []*wanted, extra []*plan.Request) []unit {
	var units []unit
	for _, k := range a.Host.Kinds {
		for _, f := range plan.Families {
			units = append(units, unit{string(k.Name), f,
				func(w *wanted) bool { return w.Backend == k.Name },
				func() (backend.Backend, error) { return a.Host.Open(k.Name, f) }})
		}
	}
	for _, l := range a.Host.Layers {
		// one unit per site the wanted attachments use, and the default
		// site, whose orphans no attachment names
		sites := map[string]*plan.Request{"": nil}
		order := []string{""}
		add := func(req *plan.Request) {
			if s := l.SiteOf(req); sites[s] == nil {
				if _, seen := sites[s]; !seen {
					order = append(order, s)
				}
				sites[s] = req
			}
		}
		for _, w := range ws {
			if l.Wants(&w.Request) {
				add(&w.Request)
			}
		}
		if l.Site != nil {
			for _, req := range extra {
				add(req)
			}
		}
		for _, site := range order {
			req := sites[site]
			for _, f := range plan.Families {
				units = append(units, unit{l.Name, f,
					func(w *wanted) bool { return l.Wants(&w.Request) && l.SiteOf(&w.Request) == site },
					func() (backend.Backend, error) { return a.Host.OpenLayer(l, f, req) }})
			}
		}
	}
	return units
}

// runUnits runs every unit's pass at once (each holds its own listing and
// write) and gathers what they found into out and rep.
func (a *Agent) runUnits(units []unit, ws []*wanted, copts converge.Options, rep *Report, out *outcomes) []error {
	var errs []error
	var wg sync.WaitGroup
	for _, u := range units {
		var want []*plan.Plan
		var idx []int
		for i, w := range ws {
			for _, pl := range w.Plans {
				if pl.Family == u.f && u.want(w) {
					want = append(want, pl)
					idx = append(idx, i)
				}
			}
		}
		be, err := u.open()
		if host.NotInstalled(err) && len(want) == 0 {
			continue // no tools: nothing of this backend can exist
		}
		if err != nil {
			for _, i := range idx {
				out.failed[i] = append(out.failed[i], err.Error()) // names its family
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := be.Sync(want, copts)
			out.mu.Lock()
			defer out.mu.Unlock()
			var lacks *caps.Error
			if errors.As(err, &lacks) {
				// never given the means: a warning, and the other units
				// go on; the attachments say what was not checked
				rep.NotRun = append(rep.NotRun, Shared{Backend: u.name, Family: u.f.String(), What: err.Error()})
				for _, i := range idx {
					out.notRun[i] = append(out.notRun[i], fmt.Sprintf("%s %s not run (lacks %s)", u.name, u.f, lacks.Missing[0]))
				}
				return
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s backend: %w", u.name, err))
				for _, i := range idx {
					out.failed[i] = append(out.failed[i], err.Error())
				}
				return
			}
			rep.addUnit(u.name, u.f, r)
			for j, res := range r.Results {
				// flows of the port may have met no DNAT while its
				// rules, or the shared ones they hang from, were not
				// there
				if i := idx[j]; res.State == converge.Repaired || (r.Wrote && len(r.Shared) > 0) {
					out.rewrote[i] = true
				}
				switch i := idx[j]; res.State {
				case converge.Repaired:
					out.repaired[i] = append(out.repaired[i], fmt.Sprintf("%s: %s", u.f, res.What))
				case converge.Error:
					out.failed[i] = append(out.failed[i], fmt.Sprintf("%s: %s", u.f, res.What))
				}
			}
		}()
	}
	wg.Wait()
	return errs
}

// retire asks each unit that no wanted attachment uses to remove its
// node-wide objects (backend.Retirer), after the units' passes pruned
// what no attachment owns; what went is reported in rep.Removed.
func retire(units []unit, ws []*wanted, rep *Report) []error {
	var errs []error
	for _, u := range units {
		if slices.ContainsFunc(ws, u.want) {
			continue
		}
		be, err := u.open()
		if err != nil {
			continue // the unit's pass has said so
		}
		r, ok := be.(backend.Retirer)
		if !ok {
			continue
		}
		what, err := r.Retire()
		var lacks *caps.Error
		if errors.As(err, &lacks) {
			rep.NotRun = append(rep.NotRun, Shared{Backend: u.name, Family: u.f.String(), What: "retire: " + err.Error()})
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", u.name, err))
			continue
		}
		if what != "" {
			rep.Removed = append(rep.Removed, Shared{Backend: u.name, Family: u.f.String(), What: what})
		}
	}
	return errs
}

// fixRouteLocalnet turns route_localnet back on where ADD turned it on
// (IPv4, masquerading): a firewall reload leaves it, a recreated
// interface does not. All interfaces are found with one routing-table
// dump.
func (a *Agent) fixRouteLocalnet(ws []*wanted, out *outcomes, dryRun bool) []error {
	var idx []int
	var ips []net.IP
	for i, w := range ws {
		for _, pl := range w.Plans {
			if len(out.failed[i]) == 0 && pl.LocalNet() {
				idx, ips = append(idx, i), append(ips, pl.ContainerNet.IP)
			}
		}
	}
	if len(ips) == 0 {
		return nil
	}
	ifNames, err := a.Host.Sysctl.HostInterfaces(ips)
	if err != nil {
		return []error{err}
	}
	state := map[string]error{} // interface -> nil when on (or turned on)
	for j, ifName := range ifNames {
		if ifName == "" {
			continue // ADD set nothing either
		}
		i := idx[j]
		err, seen := state[ifName]
		if !seen {
			var on bool
			if on, err = a.Host.Sysctl.RouteLocalnet(ifName); err == nil && !on {
				out.repaired[i] = append(out.repaired[i], "route_localnet off on "+ifName)
				if !dryRun {
					err = a.Host.Sysctl.EnableRouteLocalnet(ifName)
				}
			}
			state[ifName] = err
		}
		if err != nil {
			out.failed[i] = append(out.failed[i], err.Error())
		}
	}
	return nil
}
