package converge

// Every backend and layer syncs in one shape: read the kernel state
// once, decide from it with a pure function, write at most once. Run
// holds what they share — the orphan rule, dry runs, a pass that has
// nothing to write, what the report says of a write — so that each
// backend writes only its reading, its judging and its writing.
//
//	Read ──► S ──Decide (pure)──► Verdict ──orphan rule, DryRun──► Repair ──Write──► Report

// Pass is one backend's or layer's sync pass over one family. S is the
// state it reads; H is what its write needs to remove an orphan (a chain
// name, a map key).
type Pass[S, H any] struct {
	// Read reads the kernel state, once.
	Read func() (S, error)
	// Decide says what of the state is missing, wrong or orphaned; it
	// reads nothing and writes nothing.
	Decide func(S) Verdict[H]
	// Write carries out the repair in one transaction (per table), and
	// says whether it changed the kernel.
	Write func(S, Repair[H]) (wrote bool, err error)
}

// Verdict is what a pass decided from the state it read.
type Verdict[H any] struct {
	// Shared names the shared objects (base chains, jumps, maps,
	// programs) missing or wrong.
	Shared []string
	// Whys says, per wanted plan (oldest first), what is missing or
	// wrong; "" where it is right.
	Whys []string
	// Refused says, per wanted plan (nil: none), why a plan that Whys
	// finds wrong cannot be written on this node (a chain its
	// configuration names is missing): it is an error, left out of the
	// write, so that it does not fail the others' repair.
	Refused []string
	// Candidates are the state's objects that no wanted plan owns,
	// before the orphan rule (Report.AddOrphan) judges them.
	Candidates []Candidate[H]
	// Tidy says the state needs a write that no result, shared object
	// or orphan names: bookkeeping of the mechanism (the socket path's
	// owner entries).
	Tidy bool
}

// Candidate is kernel state no wanted plan owns: its owner as the state
// records it ("" where it records none), the object's name for the
// report, and what the write needs to remove it.
type Candidate[H any] struct {
	Network, ContainerID string
	Object               string
	Handle               H
}

// Repair is what a pass's write is to do.
type Repair[H any] struct {
	// Shared: the shared objects are to be written.
	Shared bool
	// Broken are the wanted plans to re-apply, by index.
	Broken map[int]bool
	// Prune are the orphans to remove (with Options.Prune only).
	Prune []H
}

// Empty reports whether the repair has nothing to do.
func (r Repair[H]) Empty() bool { return !r.Shared && len(r.Broken) == 0 && len(r.Prune) == 0 }

// Run runs pass p for n wanted plans: it reads, decides, reports every
// plan (ok or repaired), every orphan the rule admits, and, unless
// DryRun or nothing is to be done, writes once and records how the write
// went. A failed read fails the pass; a failed write is in the report.
func Run[S, H any](n int, o Options, p Pass[S, H]) (*Report, error) {
	st, err := p.Read()
	if err != nil {
		return nil, err
	}
	v := p.Decide(st)
	rep := NewReport(n)
	rep.Shared = v.Shared
	fix := Repair[H]{Shared: len(v.Shared) > 0, Broken: map[int]bool{}}
	for i, why := range v.Whys {
		switch {
		case why == "":
		case i < len(v.Refused) && v.Refused[i] != "":
			rep.Results[i] = Result{State: Error, What: why + ": cannot repair: " + v.Refused[i]}
		default:
			fix.Broken[i] = true
			rep.Results[i] = Result{State: Repaired, What: why}
		}
	}
	for _, c := range v.Candidates {
		if rep.AddOrphan(o, c.Network, c.ContainerID, c.Object) && o.Prune {
			fix.Prune = append(fix.Prune, c.Handle)
		}
	}
	prune := len(fix.Prune) > 0
	if o.DryRun || (fix.Empty() && !v.Tidy) {
		return rep, nil
	}
	wrote, err := p.Write(st, fix)
	switch {
	case err != nil:
		rep.WriteFailed(fix.Broken, prune, err)
		rep.Wrote = wrote
	case wrote:
		rep.WriteDone(prune)
	}
	return rep, nil
}
