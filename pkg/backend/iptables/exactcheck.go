package iptables

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/portmap-dev/portmap/pkg/plan"
)

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
			if !missingChain().MatchString(errorOutput(err)) {
				return "", nil, fmt.Errorf("check: %w", err)
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
	m := failedLine().FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// Skeleton names what of the shared objects that ADD of plans like p
// makes is missing — the jumps from the built-in chains, the mark and
// masquerade rules, the localhost guard — or "": one iptables-restore of
// -C lines, which reads those chains and changes nothing (STATUS).
func (b *Backend) Skeleton(p *plan.Plan) (string, error) {
	q := *p
	q.Conditions = nil // the shared rules alone
	shared, _, err := b.exactCheck([]*plan.Plan{&q})
	return shared, err
}
