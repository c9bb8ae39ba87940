package iptables

import (
	"errors"
	"slices"

	"github.com/portmap-dev/portmap/pkg/xt"
)

// steady reports whether a pass finds nothing to write, read over
// nf_tables netlink from our chains alone: no process, no listing of the
// nat table (kube-proxy's iptables mode keeps thousands of rules there).
// It holds when
//   - every wanted attachment's chain holds exactly its rules, as the
//     native writer writes them (xt.SameRules, as CHECK compares them);
//   - CNI-HOSTPORT-DNAT holds exactly the wanted attachments' entry
//     rules, in any order, and jumps to no other chain;
//   - the shared rules and markers are there, judged as CHECK judges
//     them (skeleton: each rule's jump or target in its chain).
//
// Anything else — a plan with conditions (iptables' -C judges those), a
// rule another iptables release spelled otherwise, an orphan, an
// iptables-legacy table — is false, and the pass reads as it always did:
// one listing and the exact check. A CNI-DN chain that nothing jumps to
// is not read here; no pass prunes one (it names no owner).
func (b *Backend) steady(ls []*layout) (bool, error) {
	names := []string{TopLevelDNATChain}
	var shared []xt.Rule
	var markers []string
	seen, jumps := map[string]bool{}, map[string]bool{}
	for _, l := range ls {
		if len(l.plan.Conditions) > 0 {
			return false, nil
		}
		names = append(names, l.chain)
		jumps[l.chain] = true
		if c := l.marker; c.Name != "" && !slices.Contains(markers, c.Name) {
			markers = append(markers, c.Name)
		}
		for _, r := range l.shared {
			if d := describe(r); !seen[d] {
				seen[d] = true
				shared = append(shared, r)
			}
		}
	}
	// newest first, as ADD inserts each attachment's at the top
	newest := make([]xt.Rule, 0, 2*len(ls))
	for i := len(ls) - 1; i >= 0; i-- {
		newest = append(newest, ls[i].entries...)
	}
	got, err := b.Kernel.Chains(Table, names, true)
	if errors.Is(err, xt.ErrLegacy) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, l := range ls {
		if l.judge(b.Family, netlinkRead(got, l.chain)) != "" {
			return false, nil
		}
	}
	if same, err := xt.SameRules(b.Family, got[TopLevelDNATChain].Exprs, newest, jumps, true); err != nil || !same {
		return false, nil
	}
	if w, err := b.Kernel.Chains(Table, markers, false); err != nil || len(w) != len(markers) {
		return false, err
	}
	missing, _, err := b.skeleton(shared)
	if errors.Is(err, xt.ErrLegacy) {
		return false, nil
	}
	return missing == "" && err == nil, err
}
