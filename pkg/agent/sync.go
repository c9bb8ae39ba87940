// Package agent is the node agent: `portmap-agent sync` brings every backend's
// and layer's kernel state to what libcni's cache says the runtime made
// (one pass), and Watch keeps it there (a pass after each firewall change
// and on an interval). It loads each cache entry's attachment exactly as
// ADD does (attach.Load) and reaches the node only through a *host.Host.
package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/portmap-dev/portmap/pkg/attach"
	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/deadline"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/netns"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/workers"
)

// Agent runs passes on a host.
type Agent struct {
	Host *host.Host
	// Gone says whether a container's network namespace is gone
	// (netns.Gone when nil).
	Gone func(netnsPath string) bool
	// parsed, in watch mode, keeps what passes parsed of the cache.
	parsed *parsedCache
}

// parsedCache is what a pass parsed of each cache file, for the next
// passes: the cache entries (cnicache.Reader) and the attachments
// loaded from them, by file and version of the file.
type parsedCache struct {
	reader  *cnicache.Reader
	configs map[string]parsedConfig
}

type parsedConfig struct {
	stamp   cnicache.Stamp
	backend backend.Name // the default backend it was loaded with
	a       *attach.Attachment
	err     error
}

// Options are the flags of `portmap-agent sync`.
type Options struct {
	// CacheDir is libcni's cache directory (its results/ holds the
	// attachments).
	CacheDir string
	// Networks limits the pass to these networks; empty: all.
	Networks []string
	Prune    bool
	// Retire, with Prune, removes the node-wide objects of layers that no
	// attachment uses any more (the socket path's programs and pins,
	// where no entry remains): one-shot `portmap-agent sync --prune`, not the
	// watcher, which would take them down between two containers.
	Retire bool
	// Sites are more sites of placed layers to visit beside the default
	// one and those the cache names (the socket path's pin directories
	// and cgroups): a site no cached attachment names any more is pruned
	// and retired only when named here.
	Sites  []*plan.Request
	DryRun bool
	JSON   bool
	// protect, when set, is asked of each orphan before it is pruned
	// (watch mode: only orphans seen twice go); true keeps it
	// (converge.ByLastPass).
	protect func(network, containerID string) bool
}

// wanted is one cached attachment, loaded.
type wanted struct {
	att cnicache.Attachment
	*attach.Attachment
}

// Sync is one pass of `portmap-agent sync`: it rebuilds every cached
// attachment's request as the runtime made it and brings both backends'
// kernel state to it, one listing and at most one write per backend and
// family.
func (a *Agent) Sync(o Options) (*Report, error) {
	defer deadline.Set(deadline.Pass)()
	rep := &Report{DryRun: o.DryRun, Attachments: []Attachment{}, Orphans: []Orphan{},
		Shared: []Shared{}, Withheld: []Withheld{}, Kept: []Orphan{}, Skipped: []Skipped{}}
	inScope := func(network string) bool {
		return len(o.Networks) == 0 || (network != "" && slices.Contains(o.Networks, network))
	}
	ws, atts, initial, err := a.readWanted(o.CacheDir, inScope, rep)
	if err != nil {
		return nil, err
	}
	ev := evidenceOf(o.CacheDir, atts, rep.Skipped)
	copts := converge.Options{InScope: inScope, Prune: o.Prune, DryRun: o.DryRun}
	if o.Prune {
		if why := noEvidence(o.CacheDir); why != "" {
			copts.Prune, rep.NotPruned = false, why
		}
	}

	if !o.DryRun {
		release, err := a.Host.Lock()
		if err != nil {
			return nil, fmt.Errorf("take the host-wide lock: %w", err)
		}
		defer release()
	}
	// Under the lock: what the ledger says now holds when the pass writes.
	ad, unread, err := a.admission(atts)
	if errors.Is(err, ledger.ErrNone) {
		// no ADD in flight could be told: any orphan may be one
		if copts.Prune {
			copts.Prune, rep.NotPruned = false, err.Error()+": an ADD in flight, whose cache entry the runtime has not written yet, could not be told from an orphan"
		}
		err = nil
	}
	if err != nil {
		return nil, err
	}
	for _, u := range unread {
		rep.Skipped = append(rep.Skipped, Skipped{File: u.File, Why: "not a ledger record: " + u.Why, Error: true})
	}
	if len(unread) > 0 && copts.Prune {
		// whose record it was is not known: it may be any orphan's
		copts.Prune, rep.NotPruned = false, fmt.Sprintf("the ledger holds %d files that are not records (%s): any orphan may be the attachment one names", len(unread), unread[0].File)
	}
	ws = ad.admit(ws, rep)
	for _, w := range ws {
		w.Attachment = w.ResolvedAs(ad.resolved(w.att))
	}
	copts.Keep = func(network, id string) converge.Keep {
		if id == "" {
			return converge.Keep{By: converge.NoEvidence, Why: ev.missing(network, id)}
		}
		if o.protect != nil && o.protect(network, id) {
			return converge.Keep{By: converge.ByLastPass, Why: "no pass before this one saw it orphaned"}
		}
		// an ADD that finished after the cache was read has a cache file
		// the first read did not see
		if fresh(o.CacheDir, initial, network, id) {
			return converge.Keep{By: converge.ByCache, Why: "its cache entry appeared during the pass"}
		}
		if why := ad.hold(network, id); why != "" {
			return converge.Keep{By: converge.ByLedger, Why: why}
		}
		if why := ev.missing(network, id); why != "" && !ad.dead(network, id) {
			return converge.Keep{By: converge.NoEvidence, Why: why}
		}
		return converge.Keep{}
	}
	out := &outcomes{repaired: make([][]string, len(ws)), failed: make([][]string, len(ws)), notRun: make([][]string, len(ws)),
		rewrote: make([]bool, len(ws))}
	units := a.units(ws, o.Sites)
	errs := a.runUnits(units, ws, copts, rep, out)
	if o.Prune && o.Retire && !o.DryRun && len(errs) == 0 {
		errs = append(errs, retire(units, ws, rep)...)
	}
	errs = append(errs, a.fixRouteLocalnet(ws, out, o.DryRun)...)
	// A UDP flow that met no DNAT while the rules were missing must meet
	// them now: the rewritten attachments' ports, in one conntrack walk,
	// which keeps the flows translated right (a live flow from the pod).
	// A repair of route_localnet alone changed no translation.
	if !o.DryRun {
		var repaired []*plan.Plan
		for i, w := range ws {
			if out.rewrote[i] && len(out.failed[i]) == 0 {
				repaired = append(repaired, w.Plans...)
			}
		}
		a.Host.Flush(repaired...)
	}
	if !o.DryRun {
		errs = append(errs, a.forget(ad.stale())...)
	}
	rep.finish(ws, out, o.DryRun)
	return rep, errors.Join(errs...)
}

// admission reads the ledger (under the host-wide lock, but for a dry
// run) and judges the cache read against it; unread are the ledger's
// files that are not records, which the pass reports.
func (a *Agent) admission(atts []cnicache.Attachment) (ad *admission, unread []ledger.Unread, err error) {
	gone := a.Gone
	if gone == nil {
		gone = netns.Gone
	}
	var records map[plan.Owner]ledger.Record
	var epoch time.Time
	if a.Host.Ledger != nil {
		records, epoch, err = a.Host.Ledger.Read()
		var ue *ledger.UnreadError
		if errors.As(err, &ue) {
			unread, err = ue.Files, nil
		}
		if errors.Is(err, ledger.ErrNone) {
			return newAdmission(records, epoch, atts, gone), nil, err
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read the ledger: %w", err)
		}
	}
	return newAdmission(records, epoch, atts, gone), unread, nil
}

// admit keeps the attachments the pass may write for; the others go to
// the report's Withheld.
func (ad *admission) admit(ws []*wanted, rep *Report) []*wanted {
	kept := ws[:0]
	for _, w := range ws {
		reason, why := ad.withhold(w.att, w.Plans)
		if reason == "" {
			kept = append(kept, w)
			continue
		}
		if reason == WithheldDeleted {
			ad.deleted[plan.Owner{Network: w.att.Network, ContainerID: w.att.ContainerID, IfName: w.att.IfName}] = true
		}
		rep.Withheld = append(rep.Withheld, Withheld{Network: w.att.Network, ContainerID: w.att.ContainerID,
			IfName: w.att.IfName, File: w.att.File, Reason: reason, Why: why})
	}
	return kept
}

// forget removes the ledger's stale records.
func (a *Agent) forget(owners []plan.Owner) []error {
	var errs []error
	for _, o := range owners {
		if _, err := a.Host.Ledger.Forget(o); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// outcomes are, per wanted attachment, what a pass repaired, what
// failed, and which units it could not run for want of a capability.
type outcomes struct {
	mu       sync.Mutex
	repaired [][]string
	failed   [][]string
	notRun   [][]string
	// rewrote is true where a backend or layer wrote the attachment's
	// rules or the shared ones they hang from (not route_localnet alone).
	rewrote []bool
}

// readWanted reads the cache and loads each entry's attachment as ADD
// loads it (one worker per core). Entries it cannot use go to the
// report; initial holds every cache file name it saw.
func (a *Agent) readWanted(dir string, inScope func(string) bool, rep *Report) ([]*wanted, []cnicache.Attachment, map[string]bool, error) {
	read := func(dir string) ([]cnicache.Attachment, []cnicache.Skipped, error) {
		return cnicache.Read(dir, "portmap")
	}
	if a.parsed != nil {
		read = a.parsed.reader.Read
	}
	atts, skipped, err := read(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	initial := map[string]bool{}
	for _, s := range skipped {
		initial[filepath.Base(s.File)] = true
		rep.Skipped = append(rep.Skipped, Skipped{File: s.File, Why: s.Why, Error: s.Corrupt})
	}
	defBackend := a.Host.DefaultBackend()
	loaded := make([]*attach.Attachment, len(atts))
	errs := make([]error, len(atts))
	for _, at := range atts {
		initial[filepath.Base(at.File)] = true
	}
	var memo map[string]parsedConfig
	if a.parsed != nil {
		memo = a.parsed.configs
	}
	workers.Each(len(atts), func(i int) {
		if !inScope(atts[i].Network) {
			return
		}
		if m, ok := memo[atts[i].File]; ok && m.stamp == atts[i].Stamp && m.backend == defBackend {
			loaded[i], errs[i] = m.a, m.err
			return
		}
		loaded[i], errs[i] = attach.Load(a.Host, atts[i].Stdin, atts[i].ContainerID, atts[i].IfName)
	})
	if a.parsed != nil {
		a.parsed.configs = make(map[string]parsedConfig, len(atts))
		for i, at := range atts {
			if inScope(at.Network) {
				a.parsed.configs[at.File] = parsedConfig{at.Stamp, defBackend, loaded[i], errs[i]}
			}
		}
	}
	var ws []*wanted
	for i, at := range atts {
		c, err := loaded[i], errs[i]
		switch {
		case !inScope(at.Network):
			continue
		case err != nil:
			rep.Skipped = append(rep.Skipped, Skipped{File: at.File, Why: "invalid portmap configuration: " + err.Error(), Error: true})
			continue
		case !c.HasMappings:
			rep.Summary.NoMappings++
			continue
		case c.PrevResult == nil:
			rep.Skipped = append(rep.Skipped, Skipped{File: at.File, Why: "cache entry without a result", Error: true})
			continue
		}
		ws = append(ws, &wanted{att: at, Attachment: c})
	}
	return ws, atts, initial, nil
}

// noEvidence says why the cache under dir is no evidence that anything
// is gone, or "" when it is: libcni makes its results directory at its
// first ADD, so a cache without one has never been written here (a cache
// directory another runtime's, or a wiped one), and the rules of
// attachments it never recorded (upstream's, an older agent's) are not
// orphans for it.
func noEvidence(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, "results")); err != nil {
		return fmt.Sprintf("%s holds no cache entries: %v", dir, err)
	}
	return ""
}

// fresh reports whether the cache now holds a file of the owner that the
// pass's first read did not see (network "" matches any network); a
// cache it cannot read now tells nothing, and keeps every owner.
func fresh(dir string, initial map[string]bool, network, id string) bool {
	des, err := os.ReadDir(filepath.Join(dir, "results"))
	if errors.Is(err, os.ErrNotExist) {
		return false // none yet (noEvidence), or removed since: no entry
	}
	if err != nil {
		return true
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
