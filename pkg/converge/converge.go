// Package converge holds what `portmap-agent sync` asks of a backend and what a
// backend answers: the options of one pass, and per attachment and orphan
// what the pass found and did. Each backend brings one IP family of its
// kernel state to the wanted plans with one read and at most one write per
// table; the plugin merges the families and backends into one report.
package converge

import (
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/workers"
)

// Options steer one pass.
type Options struct {
	// InScope reports whether objects of network may be reported and
	// pruned as orphans; network is "" when the owner is unknown (an
	// iptables chain without entry rule, upstream's nftables rules, which
	// name only the container).
	InScope func(network string) bool
	// Fresh reports whether a cache entry of the owner appeared after the
	// wanted plans were read (network "" matches any network): an ADD that
	// finished meanwhile, whose objects must not be pruned.
	Fresh func(network, containerID string) bool
	// Hold, when set, says why the objects of the owner (network "" for
	// any) must stay although no wanted plan owns them — an ADD returned
	// whose cache entry the runtime has not written yet — or "" when
	// they are an orphan. A held owner is reported, never pruned.
	Hold func(network, containerID string) string
	// Prune removes orphans; without it they are only reported.
	Prune bool
	// DryRun writes nothing and reports what a pass would do.
	DryRun bool
}

// State is what a pass found of one wanted attachment.
type State string

const (
	OK       State = "ok"
	Repaired State = "repaired"
	Error    State = "error"
)

// Result is one wanted plan's outcome, in the order of the wanted plans.
type Result struct {
	State State
	// What says what was missing or wrong (Repaired), or why it failed.
	What string
}

// Orphan is an attachment's state that no wanted plan owns.
type Orphan struct {
	// Network and ContainerID name the owner as the kernel state records
	// it; plan.Unknown when it records none.
	Network, ContainerID string
	// Object names the kernel object, e.g. "iptables ipv4 chain CNI-DN-…".
	Object string
	// Pruned is true when the pass removed it.
	Pruned bool
	// Err is why pruning it failed.
	Err string
}

// Report is one backend's pass over one family.
type Report struct {
	Results []Result
	Orphans []Orphan
	// Held are owners' objects no wanted plan owns that the pass kept
	// (Options.Hold); Err says why.
	Held []Orphan
	// Shared names shared objects (base chains, jumps, maps) the pass
	// found missing or wrong; they were repaired unless DryRun.
	Shared []string
	// Wrote is true when the pass changed the kernel.
	Wrote bool
}

// NewReport starts a report of n wanted plans, all ok.
func NewReport(n int) *Report {
	r := &Report{Results: make([]Result, n)}
	for i := range r.Results {
		r.Results[i].State = OK
	}
	return r
}

// AddOrphan adds kernel state of the owner (network, containerID; "" where
// the state records none) that no wanted plan owns — unless the pass must
// leave it alone: its network is out of scope, or its owner's cache entry
// appeared during the pass. It reports whether it added it. The one orphan
// rule of every backend and layer. An owner that Options.Hold holds goes
// to Held instead, and AddOrphan reports false: it is not pruned.
func (r *Report) AddOrphan(o Options, network, containerID, object string) bool {
	if (o.InScope != nil && !o.InScope(network)) || (o.Fresh != nil && containerID != "" && o.Fresh(network, containerID)) {
		return false
	}
	if o.Hold != nil && containerID != "" {
		if why := o.Hold(network, containerID); why != "" {
			r.Held = append(r.Held, Orphan{Network: orUnknown(network), ContainerID: containerID, Object: object, Err: why})
			return false
		}
	}
	r.Orphans = append(r.Orphans, Orphan{Network: orUnknown(network), ContainerID: orUnknown(containerID), Object: object})
	return true
}

func orUnknown(s string) string {
	if s == "" {
		return plan.Unknown
	}
	return s
}

// WriteFailed records that the pass's one write failed: the plans it was
// to repair are errors, and (when it was to prune) the orphans stay.
func (r *Report) WriteFailed(broken map[int]bool, prune bool, err error) {
	for i := range broken {
		r.Results[i] = Result{State: Error, What: r.Results[i].What + ": " + err.Error()}
	}
	if prune {
		for i := range r.Orphans {
			r.Orphans[i].Err = err.Error()
		}
	}
}

// WriteDone records that the pass's write went through.
func (r *Report) WriteDone(prune bool) {
	r.Wrote = true
	if prune {
		for i := range r.Orphans {
			r.Orphans[i].Pruned = true
		}
	}
}

// Winners returns, for each wanted plan, whether it is the newest claimant
// of each of its host-port keys (plans are given oldest first): under the
// "replace" policy the newest ADD of a host port wins, and a pass must
// keep it so. key names a plan's keys.
func Winners(want []*plan.Plan, keys func(*plan.Plan) []string) map[string]int {
	w := map[string]int{}
	for i, p := range want {
		for _, k := range keys(p) {
			w[k] = i
		}
	}
	return w
}

// Judge runs judge(i) for i in [0, n) on every core and returns what each
// said; judging a thousand attachments against a listing is the
// CPU-bound part of a pass.
func Judge(n int, judge func(i int) string) []string {
	out := make([]string, n)
	workers.Each(n, func(i int) { out[i] = judge(i) })
	return out
}
