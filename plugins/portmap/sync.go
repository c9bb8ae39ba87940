package portmap

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
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

// SyncReport is what one pass found and did; its JSON form is what
// `portmap sync --json` prints.
type SyncReport struct {
	DryRun      bool             `json:"dryRun"`
	Attachments []SyncAttachment `json:"attachments"`
	Orphans     []SyncOrphan     `json:"orphans"`
	Shared      []SyncShared     `json:"shared"`
	Skipped     []SyncSkipped    `json:"skipped"`
	Summary     SyncSummary      `json:"summary"`
}

// SyncAttachment is one cached attachment with port mappings.
type SyncAttachment struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Backend     string `json:"backend"`
	// State is "ok", "repaired" (or "would repair" with --dry-run) or
	// "error".
	State string `json:"state"`
	What  string `json:"what,omitempty"`
	File  string `json:"file"`
}

// SyncOrphan is kernel state of an owner without a cache entry.
type SyncOrphan struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	Backend     string `json:"backend"`
	Family      string `json:"family"`
	Object      string `json:"object"`
	// State is "orphan", "pruned" or "error".
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

// SyncShared is a shared object (base chain, jump, map) found missing.
type SyncShared struct {
	Backend string `json:"backend"`
	Family  string `json:"family"`
	What    string `json:"what"`
}

// SyncSkipped is a cache file that was not synced.
type SyncSkipped struct {
	File string `json:"file"`
	Why  string `json:"why"`
	// Error is true for a file that should have been usable (corrupt, or
	// an invalid portmap configuration); false for a network without
	// portmap.
	Error bool `json:"error"`
}

// SyncSummary counts the report.
type SyncSummary struct {
	Attachments int `json:"attachments"`
	OK          int `json:"ok"`
	Repaired    int `json:"repaired"`
	Errors      int `json:"errors"`
	Orphans     int `json:"orphans"`
	Pruned      int `json:"pruned"`
	Skipped     int `json:"skipped"`
	// NoMappings counts cached attachments of portmap networks without
	// port mappings (nothing to keep).
	NoMappings int `json:"noMappings"`
}

// Failed reports whether anything could not be brought to its state.
func (r *SyncReport) Failed() bool {
	if r.Summary.Errors > 0 {
		return true
	}
	for _, o := range r.Orphans {
		if o.State == "error" {
			return true
		}
	}
	for _, s := range r.Skipped {
		if s.Error {
			return true
		}
	}
	return false
}

// Changed reports whether the pass wrote anything (or would have).
func (r *SyncReport) Changed() bool {
	return r.Summary.Repaired > 0 || r.Summary.Pruned > 0 || len(r.Shared) > 0
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
	atts, skipped, err := cnicache.Read(o.CacheDir, "portmap")
	if err != nil {
		return nil, err
	}
	initial := map[string]bool{}
	rep := &SyncReport{DryRun: o.DryRun, Attachments: []SyncAttachment{}, Orphans: []SyncOrphan{},
		Shared: []SyncShared{}, Skipped: []SyncSkipped{}}
	inScope := func(network string) bool {
		return len(o.Networks) == 0 || (network != "" && slices.Contains(o.Networks, network))
	}
	for _, s := range skipped {
		initial[filepath.Base(s.File)] = true
		rep.Skipped = append(rep.Skipped, SyncSkipped{File: s.File, Why: s.Why, Error: s.Corrupt})
	}
	// The configurations are parsed as ADD parses them, one worker per
	// core.
	defBackend := p.DefaultBackend()
	configs := make([]*Config, len(atts))
	errs := make([]error, len(atts))
	var pw sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		pw.Add(1)
		go func() {
			defer pw.Done()
			for i := range next {
				configs[i], errs[i] = ParseConfig(atts[i].Stdin, atts[i].IfName, defBackend)
			}
		}()
	}
	for i, a := range atts {
		initial[filepath.Base(a.File)] = true
		if inScope(a.Network) {
			next <- i
		}
	}
	close(next)
	pw.Wait()
	var ws []*wanted
	for i, a := range atts {
		c, err := configs[i], errs[i]
		if !inScope(a.Network) {
			continue
		}
		if err != nil {
			rep.Skipped = append(rep.Skipped, SyncSkipped{File: a.File, Why: "invalid portmap configuration: " + err.Error(), Error: true})
			continue
		}
		if !c.HasMappings {
			rep.Summary.NoMappings++
			continue
		}
		if c.PrevResult == nil {
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
	// An ADD that finished after the cache was read has a cache file the
	// first read did not see: its objects are not orphans.
	fresh := func(network, id string) bool {
		des, err := os.ReadDir(filepath.Join(o.CacheDir, "results"))
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
	keep := fresh
	if o.protect != nil {
		keep = func(network, id string) bool { return o.protect(network, id) || fresh(network, id) }
	}
	copts := converge.Options{InScope: inScope, Fresh: keep, Prune: o.Prune, DryRun: o.DryRun}

	if !o.DryRun {
		release, err := p.Lock()
		if err != nil {
			return nil, fmt.Errorf("take the host-wide lock: %w", err)
		}
		defer release()
	}

	results := make([][]string, len(ws)) // per attachment: what was repaired
	failures := make([][]string, len(ws))
	var mu sync.Mutex
	var wg sync.WaitGroup
	var unitErrs []error
	// One unit per backend and family, and the forwardAccept rules of
	// each family (iptables' filter table, whichever backend maps).
	type unit struct {
		name   string
		f      plan.Family
		want   func(*wanted, *plan.Plan) bool
		syncer func() (Syncer, error)
	}
	var units []unit
	for _, name := range []string{BackendIPTables, BackendNFTables} {
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
	for _, u := range units {
		name, f := u.name, u.f
		var want []*plan.Plan
		var idx []int
		for i, w := range ws {
			for _, pl := range w.plans {
				if pl.Family == f && u.want(w, pl) {
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
				failures[i] = append(failures[i], fmt.Sprintf("%s: %v", f, err))
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := syncer.Sync(want, copts)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s backend: %w", name, err))
				for _, i := range idx {
					failures[i] = append(failures[i], err.Error())
				}
				return
			}
			for _, s := range r.Shared {
				rep.Shared = append(rep.Shared, SyncShared{Backend: name, Family: f.String(), What: s})
			}
			for j, res := range r.Results {
				i := idx[j]
				switch res.State {
				case converge.Repaired:
					results[i] = append(results[i], fmt.Sprintf("%s: %s", f, res.What))
				case converge.Error:
					failures[i] = append(failures[i], fmt.Sprintf("%s: %s", f, res.What))
				}
			}
			for _, or := range r.Orphans {
				so := SyncOrphan{Network: or.Network, ContainerID: or.ContainerID, Backend: name,
					Family: f.String(), Object: or.Object, State: "orphan"}
				switch {
				case or.Err != "":
					so.State, so.Error = "error", or.Err
				case or.Pruned:
					so.State = "pruned"
				}
				rep.Orphans = append(rep.Orphans, so)
			}
		}()
	}
	wg.Wait()

	// route_localnet, as ADD sets it (IPv4, masquerading): a firewall
	// reload leaves it, a recreated interface does not. All interfaces are
	// found with one routing-table dump.
	var lnIdx []int
	var lnIPs []net.IP
	for i, w := range ws {
		for _, pl := range w.plans {
			if len(failures[i]) == 0 && pl.Family == plan.IPv4 && pl.Masquerade.Enabled {
				lnIdx, lnIPs = append(lnIdx, i), append(lnIPs, pl.ContainerNet.IP)
			}
		}
	}
	if len(lnIPs) > 0 {
		ifNames, err := p.Sysctl.HostInterfaces(lnIPs)
		if err != nil {
			unitErrs = append(unitErrs, err)
			ifNames = make([]string, len(lnIPs))
		}
		state := map[string]error{} // interface -> nil when on (or turned on)
		for j, ifName := range ifNames {
			if ifName == "" {
				continue // ADD set nothing either
			}
			i := lnIdx[j]
			err, seen := state[ifName]
			if !seen {
				var on bool
				if on, err = p.Sysctl.RouteLocalnet(ifName); err == nil && !on {
					results[i] = append(results[i], "route_localnet off on "+ifName)
					if !o.DryRun {
						err = p.Sysctl.EnableRouteLocalnet(ifName)
					}
				}
				state[ifName] = err
			}
			if err != nil {
				failures[i] = append(failures[i], err.Error())
			}
		}
	}
	// A UDP flow that met no DNAT while the rules were missing must meet
	// them now: the repaired attachments' ports, one flush per family.
	if !o.DryRun {
		var repaired []*plan.Plan
		for i, w := range ws {
			if len(results[i]) > 0 && len(failures[i]) == 0 {
				repaired = append(repaired, w.plans...)
			}
		}
		p.flush(repaired...)
	}

	for i, w := range ws {
		a := SyncAttachment{Network: w.c.Network, ContainerID: w.att.ContainerID, IfName: w.att.IfName,
			Backend: w.c.Backend, State: string(converge.OK), File: w.att.File}
		switch {
		case len(failures[i]) > 0:
			a.State, a.What = string(converge.Error), strings.Join(append(failures[i], results[i]...), "; ")
			rep.Summary.Errors++
		case len(results[i]) > 0:
			a.State, a.What = string(converge.Repaired), strings.Join(results[i], "; ")
			if o.DryRun {
				a.State = "would repair"
			}
			rep.Summary.Repaired++
		default:
			rep.Summary.OK++
		}
		rep.Attachments = append(rep.Attachments, a)
	}
	slices.SortStableFunc(rep.Orphans, func(a, b SyncOrphan) int {
		return strings.Compare(a.Backend+a.Family+a.Object, b.Backend+b.Family+b.Object)
	})
	rep.Summary.Attachments = len(rep.Attachments)
	rep.Summary.Orphans = len(rep.Orphans)
	for _, or := range rep.Orphans {
		if or.State == "pruned" {
			rep.Summary.Pruned++
		}
	}
	rep.Summary.Skipped = len(rep.Skipped)
	return rep, errors.Join(unitErrs...)
}

// line is the attachment's report line: network, container, interface,
// state and what.
func (a SyncAttachment) line() string {
	l := fmt.Sprintf("%s %s %s: %s", a.Network, a.ContainerID, a.IfName, a.State)
	if a.What != "" {
		l += ": " + a.What
	}
	return l
}

func (s SyncShared) line(dryRun bool) string {
	verb := "repaired"
	if dryRun {
		verb = "would repair"
	}
	return fmt.Sprintf("shared %s %s: %s: %s", s.Backend, s.Family, verb, s.What)
}

func (o SyncOrphan) line(dryRun bool) string {
	state := o.State
	if state == "orphan" && dryRun {
		state = "orphan (a pass with --prune would remove it)"
	}
	l := fmt.Sprintf("%s %s -: %s: %s %s %s", o.Network, o.ContainerID, state, o.Backend, o.Family, o.Object)
	if o.Error != "" {
		l += ": " + o.Error
	}
	return l
}

func (s SyncSkipped) line() string {
	state := "skipped"
	if s.Error {
		state = "error"
	}
	return fmt.Sprintf("%s: %s: %s", s.File, state, s.Why)
}

// WriteSync prints the report: one line per attachment, orphan, shared
// repair and skipped cache file, then a summary (or the JSON form).
func WriteSync(w io.Writer, r *SyncReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	for _, a := range r.Attachments {
		fmt.Fprintln(w, a.line())
	}
	for _, s := range r.Shared {
		fmt.Fprintln(w, s.line(r.DryRun))
	}
	for _, o := range r.Orphans {
		fmt.Fprintln(w, o.line(r.DryRun))
	}
	for _, s := range r.Skipped {
		fmt.Fprintln(w, s.line())
	}
	sm := r.Summary
	dry := ""
	if r.DryRun {
		dry = " (dry run: nothing changed)"
	}
	_, err := fmt.Fprintf(w, "sync: %d attachments: %d ok, %d repaired, %d errors; %d orphans, %d pruned; %d cache entries skipped, %d without port mappings%s\n",
		sm.Attachments, sm.OK, sm.Repaired, sm.Errors, sm.Orphans, sm.Pruned, sm.Skipped, sm.NoMappings, dry)
	return err
}
