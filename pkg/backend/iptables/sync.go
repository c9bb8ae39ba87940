package iptables

import (
	"fmt"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// Sync brings this family's nat table to the wanted plans (oldest first)
// for `portmap-agent sync`. On iptables-nft a pass first reads our chains
// over netlink (steady); when they hold what is wanted, that is the whole
// pass. Otherwise one listing of the table and one iptables-restore of
// -C lines judge every attachment; one iptables-restore re-applies the
// ones missing or wrong and, with Prune, removes the orphans — chains
// CNI-DN-* that no wanted plan names (ours or the upstream plugin's: the
// layout is the same). Attachments that are right are not touched, so a
// pass after a pass writes nothing. Missing shared chains, and the
// shared rules that cannot exist without them, go into the same restore;
// the rest of a broken skeleton is checked and inserted rule by rule, as
// ADD's slow path does. The caller holds the host-wide lock.
func (b *Backend) Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error) {
	ls := make([]*layout, len(want))
	for i, p := range want {
		ls[i] = layoutOf(p)
	}
	return converge.Run(len(want), o, converge.Pass[*syncState, string]{
		Read:   func() (*syncState, error) { return b.readSync(want, ls) },
		Decide: func(s *syncState) converge.Verdict[string] { return s.decide() },
		Write:  b.writeSync,
	})
}

// syncState is the nat table as a pass read it: its listing, and what
// iptables' own comparison found wrong.
type syncState struct {
	family  plan.Family
	want    []*plan.Plan
	layouts []*layout // want's
	// steady: our chains read over netlink hold what is wanted, and
	// nothing else was read.
	steady bool
	lt     *listing
	// sharedBroken names what of the shared rules the exact check found
	// missing ("": none); checked holds, per wanted plan, what of its
	// entry rules with conditions it found missing.
	sharedBroken string
	checked      map[int]string
	// markers are the marker chains of the wanted plans the table
	// lacks: made last, once what they vouch for is written.
	markers []xt.Chain
	// op names the verb in a failed write's error: "sync", or "apply"
	// (ADD's slow path, a pass of its one attachment).
	op string
}

// listed is the state of the wanted plans as the table's listing shows
// it: the listing, and the markers it lacks.
func listed(f plan.Family, want []*plan.Plan, ls []*layout, lines []string) *syncState {
	s := &syncState{family: f, want: want, layouts: ls, lt: parseListing(lines), op: "sync"}
	seen := map[string]bool{}
	for _, l := range ls {
		if c := l.marker; c.Name != "" && !s.lt.chains[c.Name] && !seen[c.Name] {
			seen[c.Name] = true
			s.markers = append(s.markers, c)
		}
	}
	return s
}

// readSync reads our chains over netlink and, unless they are steady,
// lists the table and runs the exact check, side by side: they are
// independent.
func (b *Backend) readSync(want []*plan.Plan, ls []*layout) (*syncState, error) {
	if ok, err := b.steady(ls); err != nil {
		return nil, err
	} else if ok {
		return &syncState{family: b.Family, want: want, layouts: ls, steady: true}, nil
	}
	type checked struct {
		shared string
		broken map[int]string
		err    error
	}
	done := make(chan checked, 1)
	go func() {
		s, br, err := b.exactCheck(ls)
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
	s := listed(b.Family, want, ls, lines)
	s.sharedBroken, s.checked = ck.shared, ck.broken
	return s, nil
}

// decide judges every wanted plan (the listing first, then the exact
// check), keeps "the newest ADD wins" through the repairs, and lists the
// CNI-DN chains no wanted plan names.
func (s *syncState) decide() converge.Verdict[string] {
	var v converge.Verdict[string]
	if s.steady {
		v.Whys = make([]string, len(s.want))
		return v
	}
	v.Whys = converge.Judge(len(s.want), func(i int) string {
		l := s.layouts[i]
		return l.judge(s.family, s.lt.read(l.chain))
	})
	for i, why := range v.Whys {
		if why == "" {
			v.Whys[i] = s.checked[i]
		}
	}
	cascade(s.want, v.Whys)
	// a plan whose hairpin rules jump to an externalSetMarkChain the
	// table lacks would fail the one restore of every repair
	for i, p := range s.want {
		if c := p.Masquerade.ExternalSetMarkChain; v.Whys[i] != "" && c != "" && p.Masquerade.Enabled && !s.lt.chains[c] {
			if v.Refused == nil {
				v.Refused = make([]string, len(s.want))
			}
			v.Refused[i] = missingMarkChain(p.Family, c).Error()
		}
	}
	for _, c := range s.markers {
		v.Shared = append(v.Shared, "chain "+c.Name+" missing")
	}
	if s.sharedBroken != "" {
		v.Shared = append(v.Shared, s.sharedBroken)
	}
	wanted := map[string]bool{}
	for _, l := range s.layouts {
		wanted[l.chain] = true
	}
	for _, o := range s.lt.orphans(wanted) {
		v.Candidates = append(v.Candidates, converge.Candidate[string]{Network: o.network, ContainerID: o.id,
			Object: "chain " + o.chain, Handle: o.chain})
	}
	return v
}

// writeSync writes the repair: the shared objects left to check and
// insert one by one, then one restore — all or nothing, and by then the
// shared rules are ensured or in it.
func (b *Backend) writeSync(s *syncState, fix converge.Repair[string]) (bool, error) {
	pl, rest := s.repair(fix)
	if err := b.ensure(rest); err != nil {
		return false, err
	}
	wrote := len(rest.chains)+len(rest.rules) > 0
	if len(pl.what) == 1 { // only the table line: nothing to write
		return wrote, nil
	}
	if err := b.Kernel.Restore(pl.bytes()); err != nil {
		return wrote, b.restoreError(s.op, pl, err)
	}
	return true, nil
}

// repair is what fix writes, computed from what was read: where the
// shared rules were found missing, the shared chains the listing lacks
// and the rules that cannot exist without them, in the restore, and the
// rest of them to ensure; the broken plans' chains re-declared and
// filled; the pruned chains dropped; the missing markers last.
func (s *syncState) repair(fix converge.Repair[string]) (*payload, leftToEnsure) {
	pl := newPayload()
	var rest leftToEnsure
	if s.sharedBroken != "" {
		rest = sharedPayload(pl, s.want, s.lt)
	}
	for i, l := range s.layouts {
		if fix.Broken[i] {
			pl.redeclare(l.chain, s.lt.refs[l.chain])
			l.fill(pl)
		}
	}
	for _, chain := range fix.Prune {
		pl.drop(chain, s.lt.refs[chain])
	}
	for _, c := range s.markers {
		pl.line("-N "+c.Name, "new chain "+c.Name)
	}
	return pl, rest
}

// leftToEnsure is what of the shared objects is left to ensure one by
// one.
type leftToEnsure struct {
	chains []xt.Chain
	rules  []xt.Rule
}

// sharedPayload writes into pl the shared nat chains the listing lacks
// and the shared nat rules that cannot exist because their chain or their
// jump target was missing (after a flush that deleted the chains, that is
// all of them): one restore instead of a check and an insert per rule.
// What it cannot decide from the listing — a rule between chains that
// exist, the filter table's guard — it returns, to be checked and
// inserted as ADD's slow path does.
func sharedPayload(pl *payload, want []*plan.Plan, lt *listing) leftToEnsure {
	var rest leftToEnsure
	created, seenC, seenR := map[string]bool{}, map[xt.Chain]bool{}, map[string]bool{}
	var rules []xt.Rule
	for _, p := range want {
		for _, c := range sharedChains(p) {
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
		for _, r := range append(GuardRules(p), sharedRules(p)...) {
			if d := describe(r); !seenR[d] {
				seenR[d] = true
				rules = append(rules, r)
			}
		}
	}
	for _, r := range rules {
		if r.TableName() == Table && (created[r.Chain] || created[r.Jump]) {
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

// ensure creates the chains and rules one by one, each checked first
// (concurrent ADDs never duplicate them).
func (b *Backend) ensure(s leftToEnsure) error {
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
func cascade(want []*plan.Plan, whys []string) {
	for i := range want {
		if whys[i] == "" {
			continue
		}
		for j := i + 1; j < len(want); j++ {
			if whys[j] == "" && overlap(want[i], want[j]) {
				whys[j] = "entry rules moved above an older attachment's repaired ones of the same host port"
			}
		}
	}
}

func overlap(a, b *plan.Plan) bool {
	for _, m := range a.Runs() {
		for _, n := range b.Runs() {
			if m.Protocol == n.Protocol && m.HostPort <= n.Last() && n.HostPort <= m.Last() &&
				(m.HostIP == nil || n.HostIP == nil || m.HostIP.Equal(n.HostIP)) {
				return true
			}
		}
	}
	return false
}
