package iptables

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// checkItem is a rule exactCheck judges, and whose it is (-1: shared).
type checkItem struct {
	owner int
	rule  xt.Rule
}

// exactCheck runs what the listing cannot judge through iptables' own
// comparison (-C): the shared rules and guard, and the entry rules of
// attachments with conditions (iptables prints conditions in its own
// spelling). iptables-restore stops at the first failing line, so each
// failure is recorded and the rest checked again. It returns what of the
// shared objects is missing, or "".
func (b *Backend) exactCheck(ls []*layout) (string, map[int]string, error) {
	broken := map[int]string{}
	var items []checkItem
	seen := map[string]bool{}
	for _, l := range ls {
		for _, r := range l.shared {
			if d := describe(r); !seen[d] {
				seen[d] = true
				items = append(items, checkItem{-1, r})
			}
		}
	}
	for i, l := range ls {
		if len(l.plan.Conditions) == 0 {
			continue
		}
		for _, r := range l.entries {
			items = append(items, checkItem{i, r})
		}
	}
	shared := ""
	for len(items) > 0 {
		pl, owners := &payload{}, []int{}
		add := func(s, what string, owner int) { pl.line(s, what); owners = append(owners, owner) }
		for _, table := range []string{"filter", Table} {
			add("*"+table, "table "+table, -2)
			for _, it := range items {
				if it.rule.TableName() == table {
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
		var re *xt.RestoreError
		n := 0
		if errors.As(err, &re) {
			n = pl.failedLineNumber(re.Output)
		}
		if n < 1 || n > len(owners) || owners[n-1] == -2 {
			// A jump to a missing chain fails at COMMIT in iptables-nft,
			// naming the chain, not the line: the shared objects if they
			// are still unjudged, else everything left.
			if !missingChain().MatchString(errorOutput(err)) {
				if n >= 1 && n <= len(pl.what) && strings.HasPrefix(pl.what[n-1], "commit") {
					// iptables 1.8.7 blames COMMIT for a -C that
					// fails: each rule left is judged on its own
					return b.checkEach(items, shared, broken)
				}
				return "", nil, fmt.Errorf("check: %w", err)
			}
			what := pl.explain(errorOutput(err)) + " missing"
			if slices.ContainsFunc(items, func(it checkItem) bool { return it.owner == -1 }) {
				shared = what
				items = slices.DeleteFunc(items, func(it checkItem) bool { return it.owner == -1 })
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
		items = slices.DeleteFunc(items, func(it checkItem) bool { return it.owner == owner })
	}
	return shared, broken, nil
}

// checkEach judges items with a restore of one -C each: where iptables
// names no line of a failed -C, as 1.8.7 does (it blames COMMIT). Only a
// node where something is missing gets here.
func (b *Backend) checkEach(items []checkItem, shared string, broken map[int]string) (string, map[int]string, error) {
	for _, it := range items {
		if _, done := broken[it.owner]; done && it.owner >= 0 {
			continue
		}
		pl := &payload{}
		pl.line("*"+it.rule.TableName(), "table "+it.rule.TableName())
		pl.rule("-C", it.rule)
		err := b.Kernel.Restore(pl.bytes()) // bytes ends it with COMMIT
		if err == nil {
			continue
		}
		if !Missed(err) {
			return "", nil, fmt.Errorf("check: %w", err)
		}
		what := describe(it.rule) + " missing"
		if m := missingChain().FindStringSubmatch(errorOutput(err)); m != nil {
			what = "chain " + m[1] + " missing"
		}
		if it.owner >= 0 {
			broken[it.owner] = what
		} else if shared == "" {
			shared = what
		}
	}
	return shared, broken, nil
}

func errorOutput(err error) string {
	var re *xt.RestoreError
	if errors.As(err, &re) {
		return re.Output
	}
	return err.Error()
}

// failedLineNumber is the payload line iptables-restore names in out, or 0.
func (p *payload) failedLineNumber(out string) int {
	m := failedLine().FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// Skeleton names what of the shared objects that ADD of plans like p
// makes is missing — the jumps from the built-in chains, the mark and
// masquerade rules, the localhost guard — or "" (STATUS). On iptables-nft
// it reads those chains alone over nf_tables netlink: no process, and a
// cost that does not grow with the attachments (iptables-restore would
// load the whole table first). It judges a rule by its chain and jump —
// present, or for a rule without one (MARK, MASQUERADE, DROP) a chain not
// empty — which is what a flush takes; CHECK and sync compare rules
// exactly. On iptables-legacy it is one iptables-restore of -C lines.
// It changes nothing.
func (b *Backend) Skeleton(p *plan.Plan) (missing string, some bool, err error) {
	missing, some, err = b.skeleton(skeletonRules(p))
	if errors.Is(err, xt.ErrLegacy) {
		// some: the listing that would tell is the whole table; say
		// yes, and let STATUS ask the cache
		q := *p
		q.Conditions = nil // the shared rules alone
		missing, _, err = b.exactCheck([]*layout{layoutOf(&q)})
		return missing, true, err
	}
	return missing, some, err
}

// skeleton names the first of rules that nf_tables does not hold, by
// chain and jump; some says that one of them, or a chain of ours, is
// there. It reads no chain whose rules grow with the attachments.
func (b *Backend) skeleton(rules []xt.Rule) (missing string, some bool, err error) {
	// The rules' chains, read with their rules; the chains they jump to,
	// only whether they exist (CNI-HOSTPORT-DNAT holds every
	// attachment's entry rules). POSTROUTING holds a masquerade rule per
	// container of the ptp and bridge plugins: its jump to
	// CNI-HOSTPORT-MASQ, a chain read with its rules anyway, is judged by
	// that chain's references instead.
	byRefs := func(r xt.Rule) bool {
		return r.Chain == "POSTROUTING" && r.Jump == masqChain && slices.ContainsFunc(rules, func(o xt.Rule) bool { return o.Chain == masqChain })
	}
	var tables []string
	names, jumped := map[string][]string{}, map[string][]string{}
	for _, r := range rules {
		t := r.TableName()
		if _, ok := names[t]; !ok {
			tables = append(tables, t)
		}
		if !byRefs(r) && !slices.Contains(names[t], r.Chain) {
			names[t] = append(names[t], r.Chain)
		}
	}
	for _, r := range rules {
		t, to := r.TableName(), r.Jump
		if !xt.Targets[to] && !slices.Contains(names[t], to) && !slices.Contains(jumped[t], to) {
			jumped[t] = append(jumped[t], to)
		}
	}
	got := map[string]map[string]xt.ChainSummary{}
	for _, t := range tables {
		s, err := b.Kernel.Chains(t, names[t], true)
		if err != nil {
			return "", false, err
		}
		j, err := b.Kernel.Chains(t, jumped[t], false)
		if err != nil {
			return "", false, err
		}
		maps.Copy(s, j)
		got[t] = s
	}
	for _, r := range rules {
		builtin := slices.Contains(xt.Builtins[r.TableName()], r.Chain)
		c, ok := got[r.TableName()][r.Chain]
		to := r.Jump
		if byRefs(r) {
			if got[r.TableName()][to].Refs == 0 {
				missing = cmp.Or(missing, describe(r)+" missing")
			}
			continue
		}
		switch {
		case !ok && !builtin:
			missing = cmp.Or(missing, "chain "+r.Chain+" missing")
		case !ok || (xt.Targets[to] && c.Rules == 0) || (!xt.Targets[to] && !slices.Contains(c.Jumps, to)):
			missing = cmp.Or(missing, describe(r)+" missing")
			some = some || (ok && !builtin) // our chain, emptied
		default:
			some = true
		}
		if _, ok := got[r.TableName()][to]; ok && !xt.Targets[to] {
			some = true // a chain of ours a flush of rules leaves
		}
	}
	return missing, some, nil
}
