package iptables

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
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
		return nil, fmt.Errorf("%s: list table %s: %w", b.Family, Table, err)
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
	orphans := lt.orphans(wanted, o)
	rep.Orphans = orphans
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
			return fmt.Errorf("%s: create chain %q in table %s: %w", b.Family, c.Name, c.Table, err)
		}
	}
	for _, r := range s.rules {
		if err := b.Kernel.EnsureRule(r); err != nil {
			return fmt.Errorf("%s: ensure rule %s: %w", b.Family, describe(r), err)
		}
	}
	return nil
}

// exactCheck runs what the listing cannot judge through iptables' own
// comparison (-C): the shared rules and guard, and the entry rules of
// attachments with conditions (iptables prints conditions in its own
// spelling). iptables-restore stops at the first failing line, so each
// failure is recorded and the rest checked again. It returns what of the
// shared objects is missing, or "".
func (b *Backend) exactCheck(want []*plan.Plan) (string, map[int]string, error) {
	broken := map[int]string{}
	type item struct {
		owner int // -1: shared
		rule  Rule
	}
	var items []item
	seen := map[string]bool{}
	for _, p := range want {
		for _, r := range append(GuardRules(p), SharedRules(p)...) {
			if d := describe(r); !seen[d] {
				seen[d] = true
				items = append(items, item{-1, r})
			}
		}
	}
	for i, p := range want {
		if len(p.Conditions) == 0 {
			continue
		}
		for _, r := range EntryRules(p) {
			items = append(items, item{i, r})
		}
	}
	shared := ""
	for len(items) > 0 {
		pl, owners := &payload{}, []int{}
		add := func(s, what string, owner int) { pl.line(s, what); owners = append(owners, owner) }
		for _, table := range []string{"filter", Table} {
			add("*"+table, "table "+table, -2)
			for _, it := range items {
				if tableOf(it.rule) == table {
					pl.rule("-C", it.rule)
					owners = append(owners, it.owner)
				}
			}
			if table == "filter" {
				add("COMMIT", "commit filter", -2)
			}
		}
		err := b.Kernel.Restore(pl.bytes())
		if err == nil {
			break
		}
		var re *RestoreError
		n := 0
		if errors.As(err, &re) {
			n = pl.failedLineNumber(re.Output)
		}
		if n < 1 || n > len(owners) || owners[n-1] == -2 {
			// A jump to a missing chain fails at COMMIT in iptables-nft,
			// naming the chain, not the line: the shared objects if they
			// are still unjudged, else everything left.
			if !missingChain.MatchString(errorOutput(err)) {
				return "", nil, fmt.Errorf("%s: check: %w", b.Family, err)
			}
			what := pl.explain(errorOutput(err)) + " missing"
			if slices.ContainsFunc(items, func(it item) bool { return it.owner == -1 }) {
				shared = what
				items = slices.DeleteFunc(items, func(it item) bool { return it.owner == -1 })
				continue
			}
			for _, it := range items {
				broken[it.owner] = what
			}
			break
		}
		owner := owners[n-1]
		what := pl.what[n-1] + " missing"
		if owner == -1 {
			if shared == "" {
				shared = what
			}
		} else {
			broken[owner] = what
		}
		items = slices.DeleteFunc(items, func(it item) bool { return it.owner == owner })
	}
	return shared, broken, nil
}

func errorOutput(err error) string {
	var re *RestoreError
	if errors.As(err, &re) {
		return re.Output
	}
	return err.Error()
}

// failedLineNumber is the payload line iptables-restore names in out, or 0.
func (p *payload) failedLineNumber(out string) int {
	m := failedLine.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
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

// listing is the nat table as iptables -S prints it, by chain.
type listing struct {
	chains map[string]bool
	rules  map[string][]string // chain -> its "-A" lines
	// refs are the rules of CNI-HOSTPORT-DNAT by the CNI-DN chain they
	// jump to.
	refs map[string][]string
}

func parseListing(lines []string) *listing {
	lt := &listing{chains: map[string]bool{}, rules: map[string][]string{}, refs: map[string][]string{}}
	for _, l := range lines {
		if name, ok := strings.CutPrefix(l, "-N "); ok {
			lt.chains[name] = true
			continue
		}
		rest, ok := strings.CutPrefix(l, "-A ")
		if !ok {
			continue
		}
		chain, _, _ := strings.Cut(rest, " ")
		lt.rules[chain] = append(lt.rules[chain], l)
		if chain == TopLevelDNATChain {
			if i := strings.LastIndex(l, " -j "); i > 0 {
				lt.refs[l[i+4:]] = append(lt.refs[l[i+4:]], l)
			}
		}
	}
	return lt
}

// judge says what of p's own rules the listing shows missing or wrong, or
// "" when they are all there. The attachment's chain must hold exactly
// its rules; its entry rules are compared without conditions, which
// exactCheck judges.
func (lt *listing) judge(p *plan.Plan) string {
	chain := ChainName(p.Owner)
	if !lt.chains[chain] {
		return "chain " + chain + " missing"
	}
	var want, have []ruleID
	for _, r := range ChainRules(p) {
		want = append(want, idOf(r.Args))
	}
	for _, l := range lt.rules[chain] {
		have = append(have, idOf(splitRule(l)))
	}
	if d := diff(want, have); d != "" {
		return "chain " + chain + ": " + d
	}
	want, have = want[:0], have[:0]
	for _, r := range EntryRules(p) {
		want = append(want, entryID(r.Args))
	}
	for _, l := range lt.refs[chain] {
		have = append(have, entryID(splitRule(l)))
	}
	if d := diff(want, have); d != "" {
		return "entry rules in " + TopLevelDNATChain + ": " + d
	}
	return ""
}

// diff compares two multisets of rule identities.
func diff[K comparable](want, have []K) string {
	count := make(map[K]int, len(have))
	for _, k := range have {
		count[k]++
	}
	var missing []K
	for _, k := range want {
		if count[k] > 0 {
			count[k]--
			continue
		}
		missing = append(missing, k)
	}
	extra := 0
	for _, n := range count {
		extra += n
	}
	switch {
	case len(have) == 0:
		return fmt.Sprintf("all %d rules missing", len(want))
	case len(missing) > 0:
		return fmt.Sprintf("%d of %d rules missing or wrong (first: %v)", len(missing), len(want), missing[0])
	case extra > 0:
		return fmt.Sprintf("%d unexpected rules", extra)
	}
	return ""
}

// ruleID is what identifies a rule of ours, in the same spelling for our
// tokens and for iptables -S output: addresses with their prefix length,
// and only the options our rules use (conditions are judged by -C).
type ruleID struct {
	neg                               bool
	src, dst, proto, dport, dports    string
	comment, target, to               string
	ctstate, ctodst, ctodport, ctrsrc string
	ctrsport                          string
}

// String spells the identity as iptables would, leaving out what is
// absent.
func (r ruleID) String() string {
	var parts []string
	add := func(opt, v string) {
		if v != "" {
			parts = append(parts, opt, v)
		}
	}
	if r.neg {
		parts = append(parts, "!")
	}
	add("-s", r.src)
	add("-d", r.dst)
	add("-p", r.proto)
	add("--dport", r.dport)
	add("--dports", r.dports)
	if r.comment != "" {
		add("--comment", strconv.Quote(r.comment))
	}
	add("--ctstate", r.ctstate)
	add("--ctorigdst", r.ctodst)
	add("--ctorigdstport", r.ctodport)
	add("--ctreplsrc", r.ctrsrc)
	add("--ctreplsrcport", r.ctrsport)
	add("-j", r.target)
	add("--to-destination", r.to)
	return strings.Join(parts, " ")
}

// idOf reads a rule's identity from its tokens.
func idOf(tokens []string) ruleID {
	var r ruleID
	for i := 0; i < len(tokens); i++ {
		t := tokens[i]
		if t == "!" {
			r.neg = true
			continue
		}
		if i+1 >= len(tokens) {
			break
		}
		v := tokens[i+1]
		switch t {
		case "-s":
			r.src = withPrefix(v)
		case "-d":
			r.dst = withPrefix(v)
		case "-p":
			r.proto = v
		case "--dport":
			r.dport = v
		case "--dports", "--destination-ports":
			r.dports = v
		case "--comment":
			r.comment = v
		case "-j":
			r.target = v
		case "--to-destination":
			r.to = v
		case "--ctstate":
			r.ctstate = v
		case "--ctorigdst":
			r.ctodst = withPrefix(v)
		case "--ctorigdstport":
			r.ctodport = v
		case "--ctreplsrc":
			r.ctrsrc = withPrefix(v)
		case "--ctreplsrcport":
			r.ctrsport = v
		default:
			continue
		}
		i++
	}
	return r
}

// entryID identifies an entry rule without its conditions.
func entryID(tokens []string) ruleID {
	r := idOf(tokens)
	return ruleID{proto: r.proto, dports: r.dports, comment: r.comment, target: r.target}
}

func withPrefix(addr string) string {
	if strings.Contains(addr, "/") {
		return addr
	}
	if ip := net.ParseIP(addr); ip != nil && ip.To4() == nil {
		return addr + "/128"
	}
	return addr + "/32"
}

// splitRule splits an iptables -S line into tokens, undoing its quoting
// (double quotes, with backslash escapes inside).
func splitRule(line string) []string {
	if !strings.Contains(line, `"`) {
		return strings.Fields(line)
	}
	var out []string
	var cur strings.Builder
	inTok, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			quoted, inTok = !quoted, true
		case !quoted && (c == ' ' || c == '\t'):
			if inTok {
				out = append(out, cur.String())
				cur.Reset()
				inTok = false
			}
		default:
			cur.WriteByte(c)
			inTok = true
		}
	}
	if inTok {
		out = append(out, cur.String())
	}
	return out
}

// orphans are the CNI-DN chains no wanted plan names, in scope, and not
// of an attachment whose cache entry appeared meanwhile. Their owner is
// read from their entry rules' comment.
func (lt *listing) orphans(wanted map[string]bool, o converge.Options) []converge.Orphan {
	var names []string
	for c := range lt.chains {
		if strings.HasPrefix(c, dnChain) && !wanted[c] {
			names = append(names, c)
		}
	}
	sort.Strings(names)
	var out []converge.Orphan
	for _, c := range names {
		network, id := "?", "?"
		for _, ref := range lt.refs[c] {
			if m := entryOwnerRE.FindStringSubmatch(ref); m != nil && m[3] == c {
				network, id = m[1], m[2]
				break
			}
		}
		scopeNet := network
		if network == "?" {
			scopeNet = ""
		}
		if o.InScope != nil && !o.InScope(scopeNet) {
			continue
		}
		if o.Fresh != nil && o.Fresh(network, id) {
			continue
		}
		out = append(out, converge.Orphan{Network: network, ContainerID: id, Object: "chain " + c})
	}
	return out
}
