package iptables

import (
	"fmt"
	"strings"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Sync brings this family's nat table to the wanted plans (oldest first)
// for `portmap sync`: one listing of the table and one iptables-restore of
// -C lines judge every attachment; one iptables-restore re-applies the
// ones missing or wrong and, with Prune, removes the orphans — chains
// CNI-DN-* that no wanted plan names (ours or the upstream plugin's: the
// layout is the same). Attachments that are right are not touched, so a
// pass after a pass writes nothing. Missing shared chains, and the
// shared rules that cannot exist without them, go into the same restore;
// the rest of a broken skeleton is checked and inserted rule by rule, as
// ADD's slow path does. The caller holds the host-wide lock.
func (b *Backend) Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error) {
	rep := converge.NewReport(len(want))
	// The exact check and the listing are independent: they run side by
	// side.
	type checked struct {
		shared string
		broken map[int]string
		err    error
	}
	done := make(chan checked, 1)
	go func() {
		s, br, err := b.exactCheck(want)
		done <- checked{s, br, err}
	}()
	lines, err := b.Kernel.ListTable()
	ck := <-done
	if err != nil {
		return nil, fmt.Errorf("list table %s: %w", Table, err)
	}
	if ck.err != nil {
		return nil, ck.err
	}
	lt := parseListing(lines)
	broken := map[int]bool{}
	whys := converge.Judge(len(want), func(i int) string { return lt.judge(want[i]) })
	for i, why := range whys {
		if why == "" {
			why = ck.broken[i]
		}
		if why != "" {
			broken[i] = true
			rep.Results[i] = converge.Result{State: converge.Repaired, What: why}
		}
	}
	sharedBroken := ck.shared
	cascade(want, broken, rep)
	// Witness chains are made last, once what they vouch for is written.
	var witnesses []Chain
	seenW := map[string]bool{}
	for _, p := range want {
		if c, ok := Witness(p); ok && !lt.chains[c.Name] && !seenW[c.Name] {
			seenW[c.Name] = true
			witnesses = append(witnesses, c)
			rep.Shared = append(rep.Shared, "chain "+c.Name+" missing")
		}
	}

	wanted := map[string]bool{}
	for _, p := range want {
		wanted[ChainName(p.Owner)] = true
	}
	lt.orphans(wanted, o, rep)
	orphans := rep.Orphans
	if sharedBroken != "" {
		rep.Shared = append(rep.Shared, sharedBroken)
	}
	prune := o.Prune && len(orphans) > 0
	if o.DryRun || (len(broken) == 0 && sharedBroken == "" && !prune && len(witnesses) == 0) {
		return rep, nil
	}

	pl := newPayload()
	if sharedBroken != "" {
		// The exact check passed for the shared rules unless this is set.
		ensure := b.sharedPayload(pl, want, lt)
		if err := b.ensure(ensure); err != nil {
			rep.WriteFailed(broken, false, err)
			return rep, nil
		}
		rep.Wrote = rep.Wrote || len(ensure.chains)+len(ensure.rules) > 0
	}
	for i, p := range want {
		if !broken[i] {
			continue
		}
		chain := ChainName(p.Owner)
		pl.redeclare(chain, lt.refs[chain])
		fillChain(pl, p)
	}
	if prune {
		for _, or := range orphans {
			chain := strings.TrimPrefix(or.Object, "chain ")
			pl.drop(chain, lt.refs[chain])
		}
	}
	// Last in the restore, which is all or nothing: by then the shared
	// rules are ensured or in the restore above.
	for _, c := range witnesses {
		pl.line("-N "+c.Name, "new chain "+c.Name)
	}
	if len(pl.what) == 1 { // only the table line: nothing to write
		return rep, nil
	}
	if err := b.Kernel.Restore(pl.bytes()); err != nil {
		err = b.restoreError("sync", pl, err)
		rep.WriteFailed(broken, prune, err)
		return rep, nil
	}
	rep.WriteDone(prune)
	return rep, nil
}

// shared is what of the shared objects is left to ensure one by one.
type shared struct {
	chains []Chain
	rules  []Rule
}

// sharedPayload writes into pl the shared nat chains the listing lacks
// and the shared nat rules that cannot exist because their chain or their
// jump target was missing (after a flush that deleted the chains, that is
// all of them): one restore instead of a check and an insert per rule.
// What it cannot decide from the listing — a rule between chains that
// exist, the filter table's guard — it returns, to be checked and
// inserted as ADD's slow path does.
func (b *Backend) sharedPayload(pl *payload, want []*plan.Plan, lt *listing) shared {
	var rest shared
	created, seenC, seenR := map[string]bool{}, map[Chain]bool{}, map[string]bool{}
	var rules []Rule
	for _, p := range want {
		for _, c := range SharedChains(p) {
			if seenC[c] {
				continue
			}
			seenC[c] = true
			switch {
			case c.Table != Table:
				rest.chains = append(rest.chains, c)
			case !lt.chains[c.Name]:
				created[c.Name] = true
				pl.line("-N "+c.Name, "new chain "+c.Name)
			}
		}
		for _, r := range append(GuardRules(p), SharedRules(p)...) {
			if d := describe(r); !seenR[d] {
				seenR[d] = true
				rules = append(rules, r)
			}
		}
	}
	for _, r := range rules {
		if tableOf(r) == Table && (created[r.Chain] || created[jumpTarget(r)]) {
			cmd := "-A"
			if r.Insert {
				cmd = "-I"
			}
			pl.rule(cmd, r)
			continue
		}
		rest.rules = append(rest.rules, r)
	}
	return rest
}

// jumpTarget is the chain a rule jumps to, or "".
func jumpTarget(r Rule) string {
	for i := 0; i+1 < len(r.Args); i++ {
		if r.Args[i] == "-j" {
			return r.Args[i+1]
		}
	}
	return ""
}

// ensure creates the chains and rules one by one, each checked first
// (concurrent ADDs never duplicate them).
func (b *Backend) ensure(s shared) error {
	for _, c := range s.chains {
		if err := b.Kernel.EnsureChain(c); err != nil {
			return fmt.Errorf("create chain %q in table %s: %w", c.Name, c.Table, err)
		}
	}
	for _, r := range s.rules {
		if err := b.Kernel.EnsureRule(r); err != nil {
			return fmt.Errorf("ensure rule %s: %w", describe(r), err)
		}
	}
	return nil
}

// cascade keeps "the newest ADD wins" through a repair: a repaired plan's
// entry rules go to the top of CNI-HOSTPORT-DNAT, above a newer plan of
// the same host port that was right, so that newer plan is re-applied too
// (after it, on top).
func cascade(want []*plan.Plan, broken map[int]bool, rep *converge.Report) {
	for i := range want {
		if !broken[i] {
			continue
		}
		for j := i + 1; j < len(want); j++ {
			if !broken[j] && overlap(want[i], want[j]) {
				broken[j] = true
				rep.Results[j] = converge.Result{State: converge.Repaired,
					What: "entry rules moved above an older attachment's repaired ones of the same host port"}
			}
		}
	}
}

func overlap(a, b *plan.Plan) bool {
	for _, m := range a.Mappings {
		for _, n := range b.Mappings {
			if m.Protocol == n.Protocol && m.HostPort == n.HostPort &&
				(m.HostIP == nil || n.HostIP == nil || m.HostIP.Equal(n.HostIP)) {
				return true
			}
		}
	}
	return false
}
