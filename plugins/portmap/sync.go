package portmap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/workers"
)

// SyncOptions are the flags of `portmap sync`.
type SyncOptions struct {
	// CacheDir is libcni's cache directory (its results/ holds the
	// attachments).
	CacheDir string
	// Networks limits the pass to these networks; empty: all.
	Networks []string
	Prune    bool
	DryRun   bool
	JSON     bool
	// protect, when set, is asked of each orphan before it is pruned
	// (watch mode: only orphans seen twice go); true keeps it.
	protect func(network, containerID string) bool
}

// Syncer is the part of a backend `portmap sync` uses.
type Syncer interface {
	// Sync brings the family's state to want (oldest first); the caller
	// holds the host-wide lock.
	Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error)
}

// wanted is one cached attachment's plans.
type wanted struct {
	att   cnicache.Attachment
	c     *Config
	plans []*plan.Plan
}

// Sync is one pass of `portmap sync`: it rebuilds every cached
// attachment's request as the runtime made it and brings both backends'
// kernel state to it, one listing and at most one write per backend and
// family.
func (p *Plugin) Sync(o SyncOptions) (*SyncReport, error) {
	rep := &SyncReport{DryRun: o.DryRun, Attachments: []SyncAttachment{}, Orphans: []SyncOrphan{},
		Shared: []SyncShared{}, Skipped: []SyncSkipped{}}
	inScope := func(network string) bool {
		return len(o.Networks) == 0 || (network != "" && slices.Contains(o.Networks, network))
	}
	ws, initial, err := p.readWanted(o.CacheDir, inScope, rep)
	if err != nil {
		return nil, err
	}
	// An ADD that finished after the cache was read has a cache file the
	// first read did not see: its objects are not orphans.
	keep := func(network, id string) bool { return fresh(o.CacheDir, initial, network, id) }
	if o.protect != nil {
		keep = func(network, id string) bool {
			return o.protect(network, id) || fresh(o.CacheDir, initial, network, id)
		}
	}
	copts := converge.Options{InScope: inScope, Fresh: keep, Prune: o.Prune, DryRun: o.DryRun}

	if !o.DryRun {
		release, err := p.Lock()
		if err != nil {
			return nil, fmt.Errorf("take the host-wide lock: %w", err)
		}
		defer release()
	}
	out := &outcomes{repaired: make([][]string, len(ws)), failed: make([][]string, len(ws))}
	errs := p.runUnits(ws, copts, rep, out)
	errs = append(errs, p.fixRouteLocalnet(ws, out, o.DryRun)...)
	// A UDP flow that met no DNAT while the rules were missing must meet
	// them now: the repaired attachments' ports, in one conntrack walk.
	if !o.DryRun {
		var repaired []*plan.Plan
		for i, w := range ws {
			if len(out.repaired[i]) > 0 && len(out.failed[i]) == 0 {
				repaired = append(repaired, w.plans...)
			}
		}
		p.flush(repaired...)
	}
	rep.finish(ws, out, o.DryRun)
	return rep, errors.Join(errs...)
}

// outcomes are, per wanted attachment, what a pass repaired and what
// failed.
type outcomes struct {
	mu       sync.Mutex
	repaired [][]string
	failed   [][]string
}

// readWanted reads the cache and parses each entry's configuration as ADD
// parses it (one worker per core). Entries it cannot use go to the
// report; initial holds every cache file name it saw.
func (p *Plugin) readWanted(dir string, inScope func(string) bool, rep *SyncReport) ([]*wanted, map[string]bool, error) {
	atts, skipped, err := cnicache.Read(dir, "portmap")
	if err != nil {
		return nil, nil, err
	}
	initial := map[string]bool{}
	for _, s := range skipped {
		initial[filepath.Base(s.File)] = true
		rep.Skipped = append(rep.Skipped, SyncSkipped{File: s.File, Why: s.Why, Error: s.Corrupt})
	}
	defBackend := p.DefaultBackend()
	configs := make([]*Config, len(atts))
	errs := make([]error, len(atts))
	for _, a := range atts {
		initial[filepath.Base(a.File)] = true
	}
	workers.Each(len(atts), func(i int) {
		if inScope(atts[i].Network) {
			configs[i], errs[i] = ParseConfig(atts[i].Stdin, atts[i].IfName, defBackend)
		}
	})
	var ws []*wanted
	for i, a := range atts {
		c, err := configs[i], errs[i]
		switch {
		case !inScope(a.Network):
			continue
		case err != nil:
			rep.Skipped = append(rep.Skipped, SyncSkipped{File: a.File, Why: "invalid portmap configuration: " + err.Error(), Error: true})
			continue
		case !c.HasMappings:
			rep.Summary.NoMappings++
			continue
		case c.PrevResult == nil:
			rep.Skipped = append(rep.Skipped, SyncSkipped{File: a.File, Why: "cache entry without a result", Error: true})
			continue
		}
		c.Request.Owner = plan.Owner{Network: c.Network, ContainerID: a.ContainerID, IfName: a.IfName}
		w := &wanted{att: a, c: c}
		for _, f := range plan.Families {
			if n := c.ContainerNets[f]; n != nil {
				if pl := plan.Build(c.Request, f, n); !pl.Empty() {
					w.plans = append(w.plans, pl)
				}
			}
		}
		ws = append(ws, w)
	}
	return ws, initial, nil
}

// fresh reports whether the cache now holds a file of the owner that the
// pass's first read did not see (network "" matches any network).
func fresh(dir string, initial map[string]bool, network, id string) bool {
	des, err := os.ReadDir(filepath.Join(dir, "results"))
	if err != nil {
		return false
	}
	for _, de := range des {
		n := de.Name()
		if initial[n] {
			continue
		}
		if (network == "" && strings.Contains(n, "-"+id+"-")) || strings.HasPrefix(n, network+"-"+id+"-") {
			return true
		}
	}
	return false
}

// unit is one Syncer of one family, and which plans it keeps.
type unit struct {
	name   BackendName
	f      plan.Family
	want   func(*wanted, *plan.Plan) bool
	syncer func() (Syncer, error)
}

// units are one per backend and family, and the forwardAccept rules of
// each family (iptables' filter table, whichever backend maps).
func (p *Plugin) units() []unit {
	var units []unit
	for _, name := range []BackendName{BackendIPTables, BackendNFTables} {
		for _, f := range plan.Families {
			units = append(units, unit{name, f,
				func(w *wanted, _ *plan.Plan) bool { return w.c.Backend == name },
				func() (Syncer, error) {
					be, err := p.NewBackend(name, f)
					if err != nil {
						return nil, err
					}
					s, ok := be.(Syncer)
					if !ok {
						return nil, fmt.Errorf("%s backend cannot sync", name)
					}
					return s, nil
				}})
		}
	}
	for _, f := range plan.Families {
		units = append(units, unit{BackendIPTables, f,
			func(_ *wanted, pl *plan.Plan) bool { return pl.ForwardAccept },
			func() (Syncer, error) { return p.NewForward(f) }})
	}
	return units
}

// runUnits runs every unit's pass at once (each holds its own listing and
// write) and gathers what they found into out and rep.
func (p *Plugin) runUnits(ws []*wanted, copts converge.Options, rep *SyncReport, out *outcomes) []error {
	var errs []error
	var wg sync.WaitGroup
	for _, u := range p.units() {
		var want []*plan.Plan
		var idx []int
		for i, w := range ws {
			for _, pl := range w.plans {
				if pl.Family == u.f && u.want(w, pl) {
					want = append(want, pl)
					idx = append(idx, i)
				}
			}
		}
		syncer, err := u.syncer()
		if errors.Is(err, exec.ErrNotFound) && len(want) == 0 {
			continue // no tools: nothing of this backend can exist
		}
		if err != nil {
			for _, i := range idx {
				out.failed[i] = append(out.failed[i], fmt.Sprintf("%s: %v", u.f, err))
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := syncer.Sync(want, copts)
			out.mu.Lock()
			defer out.mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s backend: %w", u.name, err))
				for _, i := range idx {
					out.failed[i] = append(out.failed[i], err.Error())
				}
				return
			}
			rep.addUnit(u.name, u.f, r)
			for j, res := range r.Results {
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

// fixRouteLocalnet turns route_localnet back on where ADD turned it on
// (IPv4, masquerading): a firewall reload leaves it, a recreated
// interface does not. All interfaces are found with one routing-table
// dump.
func (p *Plugin) fixRouteLocalnet(ws []*wanted, out *outcomes, dryRun bool) []error {
	var idx []int
	var ips []net.IP
	for i, w := range ws {
		for _, pl := range w.plans {
			if len(out.failed[i]) == 0 && pl.LocalNet() {
				idx, ips = append(idx, i), append(ips, pl.ContainerNet.IP)
			}
		}
	}
	if len(ips) == 0 {
		return nil
	}
	ifNames, err := p.Sysctl.HostInterfaces(ips)
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
			if on, err = p.Sysctl.RouteLocalnet(ifName); err == nil && !on {
				out.repaired[i] = append(out.repaired[i], "route_localnet off on "+ifName)
				if !dryRun {
					err = p.Sysctl.EnableRouteLocalnet(ifName)
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
