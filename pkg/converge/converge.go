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
	// Keep says why the objects of an owner no wanted plan owns stay
	// (network "" for any; containerID "" where the objects name no
	// owner), and which clock said so; the zero Keep: they are an orphan.
	Keep func(network, containerID string) Keep
	// Prune removes orphans; without it they are only reported.
	Prune bool
	// DryRun writes nothing and reports what a pass would do.
	DryRun bool
}

// Keep is why an owner's objects that look orphaned stay, and the clock
// that answered: its cache entry appeared while the pass ran (ByCache),
// its ADD or DEL is on record (ByLedger), nothing the pass read can name
// it gone (NoEvidence: a cache that holds no entry of its network, an
// entry of its that cannot be read, objects that name no owner), or no
// pass before this one saw it orphaned (ByLastPass: the watcher prunes
// what two passes saw). The ledger's and the evidence's are reported
// (Report.Kept): the others are no orphans yet.
type Keep struct {
	By  Clock
	Why string
}

// Clock is what answered a Keep.
type Clock string

const (
	ByCache    Clock = "cache"
	ByLedger   Clock = "ledger"
	NoEvidence Clock = "evidence"
	ByLastPass Clock = "last pass"
)

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
	// Kept are owners' objects no wanted plan owns that the ledger or
	// the want of evidence kept (Options.Keep, ByLedger, NoEvidence); Err
	// says why.
	Kept []Orphan
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
// leave it alone: its network is out of scope, or Options.Keep keeps it
// (kept by the ledger, it goes to Kept). It reports whether it added it:
// the one orphan rule of every backend and layer.
func (r *Report) AddOrphan(o Options, network, containerID, object string) bool {
	if o.InScope != nil && !o.InScope(network) {
		return false
	}
	if o.Keep != nil {
		switch k := o.Keep(network, containerID); k.By {
		case "":
		case ByLedger, NoEvidence:
			r.Kept = append(r.Kept, Orphan{Network: orUnknown(network), ContainerID: orUnknown(containerID), Object: object, Err: k.Why})
			return false
		default:
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

// Judge runs judge(i) for i in [0, n) on every core and returns what each
// said; judging a thousand attachments against a listing is the
// CPU-bound part of a pass.
func Judge(n int, judge func(i int) string) []string {
	out := make([]string, n)
	workers.Each(n, func(i int) { out[i] = judge(i) })
	return out
}
