package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Report is what one pass found and did; its JSON form is what
// `portmap-agent sync --json` prints.
type Report struct {
	DryRun      bool         `json:"dryRun"`
	Attachments []Attachment `json:"attachments"`
	Orphans     []Orphan     `json:"orphans"`
	Shared      []Shared     `json:"shared"`
	// Removed are node-wide objects retired because nothing uses them
	// (sync --prune: the socket path's programs and pins).
	Removed []Shared `json:"removed,omitempty"`
	// Withheld are cached attachments the pass wrote nothing for: their
	// DEL has begun, their container is gone, or the cache entry predates
	// their last ADD (pkg/ledger).
	Withheld []Withheld `json:"withheld"`
	// Kept are objects of owners without a cache entry that the pass left
	// alone although they look orphaned: an ADD on record whose cache
	// entry the runtime has not written yet. Never pruned.
	Kept    []Orphan  `json:"kept"`
	Skipped []Skipped `json:"skipped"`
	// NotPruned says why a pass asked to prune removed nothing: it had
	// no evidence that anything is gone.
	NotPruned string `json:"notPruned,omitempty"`
	// NotRun are the units (a backend or layer of one family) the pass
	// skipped because this process lacks a capability they need (an
	// agent's container given fewer): a warning, not a failed pass.
	NotRun  []Shared `json:"notRun,omitempty"`
	Summary Summary  `json:"summary"`
}

// Attachment is one cached attachment with port mappings.
type Attachment struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Backend     string `json:"backend"`
	// State is "ok", "repaired" (or "would repair" with --dry-run) or
	// "error".
	State string `json:"state"`
	What  string `json:"what,omitempty"`
	File  string `json:"file"`
	// HostPorts are its host ports, as "8080/tcp, 9000-9010/udp".
	HostPorts string `json:"hostPorts"`
}

// Orphan is kernel state of an owner without a cache entry.
type Orphan struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	Backend     string `json:"backend"`
	Family      string `json:"family"`
	Object      string `json:"object"`
	// State is "orphan", "pruned" or "error".
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

// Withheld is a cached attachment a pass did not write for.
type Withheld struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	File        string `json:"file"`
	// Reason is WithheldDeleted, WithheldGone or WithheldSuperseded; Why
	// says it in words.
	Reason string `json:"reason"`
	Why    string `json:"why"`
}

func (w Withheld) line() string {
	return fmt.Sprintf("%s %s %s: withheld (%s): %s", w.Network, w.ContainerID, w.IfName, w.Reason, w.Why)
}

// Shared is a shared object (base chain, jump, map) found missing.
type Shared struct {
	Backend string `json:"backend"`
	Family  string `json:"family"`
	What    string `json:"what"`
}

// Skipped is a cache file that was not synced.
type Skipped struct {
	File string `json:"file"`
	Why  string `json:"why"`
	// Error is true for a file that should have been usable (corrupt, or
	// an invalid portmap configuration); false for a network without
	// portmap.
	Error bool `json:"error"`
}

// Summary counts the report.
type Summary struct {
	Attachments int `json:"attachments"`
	OK          int `json:"ok"`
	Repaired    int `json:"repaired"`
	Errors      int `json:"errors"`
	Orphans     int `json:"orphans"`
	Pruned      int `json:"pruned"`
	Skipped     int `json:"skipped"`
	// Withheld counts Report.Withheld, Kept Report.Kept.
	Withheld int `json:"withheld"`
	Kept     int `json:"kept"`
	// NoMappings counts cached attachments of portmap networks without
	// port mappings (nothing to keep).
	NoMappings int `json:"noMappings"`
}

// Failed reports whether anything could not be brought to its state.
func (r *Report) Failed() bool {
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
func (r *Report) Changed() bool {
	return r.Summary.Repaired > 0 || r.Summary.Pruned > 0 || len(r.Shared) > 0 || len(r.Removed) > 0
}

// addUnit takes one unit's shared objects and orphans into the report.
func (r *Report) addUnit(backend string, f plan.Family, u *converge.Report) {
	for _, s := range u.Shared {
		r.Shared = append(r.Shared, Shared{Backend: backend, Family: f.String(), What: s})
	}
	for _, or := range u.Orphans {
		so := Orphan{Network: or.Network, ContainerID: or.ContainerID, Backend: backend,
			Family: f.String(), Object: or.Object, State: "orphan"}
		switch {
		case or.Err != "":
			so.State, so.Error = "error", or.Err
		case or.Pruned:
			so.State = "pruned"
		}
		r.Orphans = append(r.Orphans, so)
	}
	for _, h := range u.Kept {
		r.Kept = append(r.Kept, Orphan{Network: h.Network, ContainerID: h.ContainerID, Backend: backend,
			Family: f.String(), Object: h.Object, State: "kept", Error: h.Err})
	}
}

// finish adds one line per wanted attachment and the summary.
func (r *Report) finish(ws []*wanted, out *outcomes, dryRun bool) {
	for i, w := range ws {
		a := Attachment{Network: w.Network, ContainerID: w.att.ContainerID, IfName: w.att.IfName,
			Backend: string(w.Backend), State: string(converge.OK), File: w.att.File, HostPorts: w.Request.Mappings.HostPorts()}
		switch {
		case len(out.failed[i]) > 0:
			a.State, a.What = string(converge.Error), strings.Join(append(out.failed[i], out.repaired[i]...), "; ")
			r.Summary.Errors++
		case len(out.repaired[i]) > 0:
			a.State, a.What = string(converge.Repaired), strings.Join(out.repaired[i], "; ")
			if dryRun {
				a.State = "would repair"
			}
			r.Summary.Repaired++
		default:
			r.Summary.OK++
		}
		if len(out.notRun[i]) > 0 && a.State != string(converge.Error) {
			a.What = strings.Join(append(out.notRun[i], a.What), "; ")
			a.What = strings.TrimSuffix(a.What, "; ")
		}
		r.Attachments = append(r.Attachments, a)
	}
	sortOrphans(r.Orphans)
	r.Summary.Attachments = len(r.Attachments)
	r.Summary.Orphans = len(r.Orphans)
	for _, or := range r.Orphans {
		if or.State == "pruned" {
			r.Summary.Pruned++
		}
	}
	r.Summary.Skipped = len(r.Skipped)
	sortOrphans(r.Kept)
	r.Summary.Withheld, r.Summary.Kept = len(r.Withheld), len(r.Kept)
}

// sortOrphans orders orphans by backend, family and object. (sort, not
// slices: a generic sort is a copy of the algorithm per element type, and
// the plugin's binary carries every copy.)
func sortOrphans(list []Orphan) {
	sort.SliceStable(list, func(i, j int) bool {
		return list[i].Backend+list[i].Family+list[i].Object < list[j].Backend+list[j].Family+list[j].Object
	})
}

// line is the attachment's report line: network, container, interface,
// state and what.
func (a Attachment) line() string {
	l := fmt.Sprintf("%s %s %s: %s", a.Network, a.ContainerID, a.IfName, a.State)
	if a.What != "" {
		l += ": " + a.What
	}
	return l
}

func (s Shared) line(dryRun bool) string {
	verb := "repaired"
	if dryRun {
		verb = "would repair"
	}
	return fmt.Sprintf("shared %s %s: %s: %s", s.Backend, s.Family, verb, s.What)
}

func (o Orphan) line(dryRun bool) string {
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

func (s Skipped) line() string {
	state := "skipped"
	if s.Error {
		state = "error"
	}
	return fmt.Sprintf("%s: %s: %s", s.File, state, s.Why)
}

// Write prints the report: one line per attachment, orphan, shared
// repair and skipped cache file, then a summary (or the JSON form).
func (r *Report) Write(w io.Writer, asJSON bool) error {
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
	for _, s := range r.Removed {
		fmt.Fprintf(w, "shared %s %s: removed: %s\n", s.Backend, s.Family, s.What)
	}
	for _, x := range r.Withheld {
		fmt.Fprintln(w, x.line())
	}
	for _, k := range r.Kept {
		fmt.Fprintf(w, "%s %s -: kept: %s %s %s: %s\n", k.Network, k.ContainerID, k.Backend, k.Family, k.Object, k.Error)
	}
	for _, s := range r.Skipped {
		fmt.Fprintln(w, s.line())
	}
	if r.NotPruned != "" {
		fmt.Fprintf(w, "orphans not pruned: %s\n", r.NotPruned)
	}
	for _, s := range r.NotRun {
		fmt.Fprintf(w, "shared %s %s: not run: %s\n", s.Backend, s.Family, s.What)
	}
	sm := r.Summary
	dry := ""
	if r.DryRun {
		dry = " (dry run: nothing changed)"
	}
	held := ""
	if sm.Withheld > 0 || sm.Kept > 0 {
		held = fmt.Sprintf("; %d withheld, %d kept", sm.Withheld, sm.Kept)
	}
	_, err := fmt.Fprintf(w, "sync: %d attachments: %d ok, %d repaired, %d errors; %d orphans, %d pruned%s; %d cache entries skipped, %d without port mappings%s\n",
		sm.Attachments, sm.OK, sm.Repaired, sm.Errors, sm.Orphans, sm.Pruned, held, sm.Skipped, sm.NoMappings, dry)
	return err
}
