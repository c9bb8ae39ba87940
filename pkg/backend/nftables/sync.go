package nftables

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Sync brings this family's cni_portmap table to the wanted plans (oldest
// first) for `portmap sync`: one listing of the table judges the skeleton
// and every attachment (its chain's rules and the map elements of the keys
// it wins: the newest plan of a key wins), and one transaction re-applies
// what is missing or wrong and, with Prune, removes orphans — dn- chains
// no wanted plan names, with the elements that point at them, and the
// upstream plugin's cni_hostport rules of containers no wanted plan
// names. Attachments that are right are not touched, so a pass after a
// pass writes nothing. The caller holds the host-wide lock.
func (b *Backend) Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error) {
	rep := converge.NewReport(len(want))
	fam := nftFamily(b.Family)
	var out, upstream string
	var errOut, errUp error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); out, errOut = b.Kernel.Run(fmt.Sprintf("list table %s %s\n", fam, Table)) }()
	go func() {
		defer wg.Done()
		upstream, errUp = b.Kernel.Run(fmt.Sprintf("list table %s %s\n", fam, UpstreamTable))
	}()
	wg.Wait()
	if IsNotFound(errOut) {
		out, errOut = "", nil
	}
	if IsNotFound(errUp) {
		upstream, errUp = "", nil
	}
	if errOut != nil {
		return nil, fmt.Errorf("%s: list table: %w", b.Family, errOut)
	}
	if errUp != nil {
		return nil, fmt.Errorf("%s: list %s: %w", b.Family, UpstreamTable, errUp)
	}
	chains := splitChains(out)
	holders := parseMaps(out)

	mapKey := func(k Key) string { return k.Map() + " " + k.String() }
	winner := converge.Winners(want, func(p *plan.Plan) []string {
		var ks []string
		for _, k := range Keys(p) {
			ks = append(ks, mapKey(k))
		}
		return ks
	})

	// The skeleton every wanted plan relies on.
	var shared []string
	kinds := map[string]*plan.Plan{}
	for _, p := range want {
		kinds[fmt.Sprintf("%v/%d/%v", marksOwnBit(p), p.Masquerade.MarkBit, p.LocalNet())] = p
	}
	switch {
	case len(want) == 0:
	case out == "":
		shared = append(shared, fmt.Sprintf("table %s %s missing", fam, Table))
	default:
		for _, m := range []string{HostPortsMap, HostIPPortsMap} {
			if !strings.Contains(out, "map "+m+" {") {
				shared = append(shared, "map "+m+" missing")
			}
		}
		for _, k := range sortedKinds(kinds) {
			skel := skeletonRules(kinds[k])
			for _, c := range skeletonOrder(skel) {
				text, ok := chains[c]
				if !ok {
					if !slices.Contains(shared, "chain "+c+" missing") {
						shared = append(shared, "chain "+c+" missing")
					}
					continue
				}
				for _, r := range skel[c] {
					if !strings.Contains(text, signature(r)) && !contains(shared, "chain "+c) {
						shared = append(shared, fmt.Sprintf("chain %s: rule %q missing", c, r))
					}
				}
			}
		}
	}
	rep.Shared = shared

	broken := map[int]bool{}
	whys := converge.Judge(len(want), func(i int) string { return judge(want[i], chains, holders, winner, i) })
	for i, why := range whys {
		if why != "" {
			broken[i] = true
			rep.Results[i] = converge.Result{State: converge.Repaired, What: why}
		}
	}

	wanted, wantedIDs := map[string]bool{}, map[string]bool{}
	for _, p := range want {
		wanted[ChainName(p.Owner)] = true
		wantedIDs[p.Owner.ContainerID] = true
	}
	var orphanChains []string
	for _, name := range sortedChainNames(chains) {
		if !strings.HasPrefix(name, "dn-") || wanted[name] {
			continue
		}
		network, id := "?", "?"
		if m := ownerCommentRE.FindStringSubmatch(chains[name]); m != nil {
			network, id = m[1], m[2]
		}
		scope := network
		if network == "?" {
			scope = ""
		}
		if (o.InScope != nil && !o.InScope(scope)) || (o.Fresh != nil && o.Fresh(network, id)) {
			continue
		}
		orphanChains = append(orphanChains, name)
		rep.Orphans = append(rep.Orphans, converge.Orphan{Network: network, ContainerID: id, Object: "chain " + name})
	}
	upRules := upstreamRules(upstream)
	var upIDs []string
	for id := range upRules {
		if wantedIDs[id] || (o.InScope != nil && !o.InScope("")) || (o.Fresh != nil && o.Fresh("", id)) {
			continue
		}
		upIDs = append(upIDs, id)
	}
	sort.Strings(upIDs)
	for _, id := range upIDs {
		rep.Orphans = append(rep.Orphans, converge.Orphan{Network: "?", ContainerID: id,
			Object: fmt.Sprintf("%d rules in table %s", len(upRules[id]), UpstreamTable)})
	}

	prune := o.Prune && len(rep.Orphans) > 0
	if o.DryRun || (len(broken) == 0 && len(shared) == 0 && !prune) {
		return rep, nil
	}

	tx := newTx(b.Family)
	if len(shared) > 0 || (len(broken) > 0 && out == "") {
		for _, k := range sortedKinds(kinds) {
			addSkeleton(tx, kinds[k])
		}
	}
	// Element changes are computed as a whole, so that a key is deleted
	// or added once even when a repair and a prune both touch it.
	desired := map[string]string{}
	for i, p := range want {
		if !broken[i] {
			continue
		}
		chain := ownChain(p)
		tx.Add(chain)
		tx.Flush(chain)
		for _, r := range chainRules(p) {
			tx.Add(r)
		}
		mine := map[string]bool{}
		for _, k := range Keys(p) {
			mine[mapKey(k)] = true
			if winner[mapKey(k)] == i {
				desired[mapKey(k)] = chain.Name
			}
		}
		for mk, h := range holders {
			if h == chain.Name && !mine[mk] {
				if _, set := desired[mk]; !set {
					desired[mk] = ""
				}
			}
		}
	}
	if prune {
		orphan := map[string]bool{}
		for _, c := range orphanChains {
			orphan[c] = true
		}
		for mk, h := range holders {
			if _, set := desired[mk]; orphan[h] && !set {
				desired[mk] = ""
			}
		}
	}
	if len(shared) > 0 && out == "" {
		holders = map[string]string{} // the table is new: nothing to delete
	}
	for _, mk := range sortedStrings(desired) {
		m, ks, _ := strings.Cut(mk, " ")
		k, ok := parseKey(ks)
		if !ok {
			continue
		}
		cur, want := holders[mk], desired[mk]
		if cur == want {
			continue
		}
		if cur != "" {
			tx.Delete(&knftables.Element{Map: m, Key: k.Fields()})
		}
		if want != "" {
			tx.Add(&knftables.Element{Map: m, Key: k.Fields(), Value: []string{"goto " + want}})
		}
	}
	script := ""
	if tx.NumOperations() > 0 {
		script = tx.String()
	}
	if prune {
		for _, c := range orphanChains {
			script += fmt.Sprintf("flush chain %s %s %s\ndelete chain %s %s %s\n", fam, Table, c, fam, Table, c)
		}
		for _, id := range upIDs {
			for _, r := range upRules[id] {
				script += fmt.Sprintf("delete rule %s %s %s handle %s\n", fam, UpstreamTable, r.chain, r.handle)
			}
		}
	}
	if script == "" {
		return rep, nil
	}
	if _, err := b.Kernel.Run(script); err != nil {
		err = fmt.Errorf("%s: sync: %w", b.Family, err)
		rep.WriteFailed(broken, prune, err)
		return rep, nil
	}
	rep.WriteDone(prune)
	return rep, nil
}

// judge says what of plan i the listing shows missing or wrong, or "".
func judge(p *plan.Plan, chains map[string]string, holders map[string]string, winner map[string]int, i int) string {
	own := ChainName(p.Owner)
	text, ok := chains[own]
	if !ok {
		return "chain " + own + " missing"
	}
	rules := chainRules(p)
	for _, r := range rules {
		c := `comment "` + *r.Comment + `"`
		var parts []string
		switch {
		case strings.HasPrefix(*r.Comment, keyComment):
			parts = []string{c, "dnat "}
		default:
			parts = []string{c, "jump " + MarkChain(p.Masquerade.MarkBit)}
		}
		if !lineWith(text, parts...) {
			return fmt.Sprintf("chain %s: rule %q missing", own, *r.Comment)
		}
	}
	for _, m := range p.Mappings {
		k := Key{HostIP: m.HostIP, Protocol: m.Protocol, Port: m.HostPort}
		want := "dnat to " + p.Target(m)
		if !lineWith(text, `comment "`+keyComment+k.String()+`"`, want) {
			return fmt.Sprintf("chain %s: rule for %s does not %s", own, k, want)
		}
		if p.Masquerade.Enabled && !p.Masquerade.All && !lineWith(text, `comment "`+hairpinComment+k.String()+`"`, "saddr "+p.HairpinSource()+" ") {
			return fmt.Sprintf("chain %s: hairpin rule for %s does not match %s", own, k, p.HairpinSource())
		}
	}
	if n := ruleLines(text); n != len(rules) {
		return fmt.Sprintf("chain %s holds %d rules, want %d", own, n, len(rules))
	}
	for _, k := range Keys(p) {
		mk := k.Map() + " " + k.String()
		if winner[mk] != i {
			continue // a newer attachment holds it
		}
		if h := holders[mk]; h != own {
			if h == "" {
				return fmt.Sprintf("map %s has no element %s", k.Map(), k)
			}
			return fmt.Sprintf("map %s sends %s to %s, not to %s", k.Map(), k, h, own)
		}
	}
	return ""
}

// ruleLines counts the rules in a chain's listed text.
func ruleLines(text string) int {
	n := 0
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || l == "}" || strings.HasPrefix(l, "comment ") {
			continue
		}
		n++
	}
	return n
}

var ownerCommentRE = regexp.MustCompile(`(?m)^\s*comment "net=(\S*) id=(\S*)`)

type upstreamRule struct{ chain, handle string }

// upstreamRules are the upstream plugin's cni_hostport rules by the
// container ID of their comment.
func upstreamRules(out string) map[string][]upstreamRule {
	rules := map[string][]upstreamRule{}
	chain := ""
	for _, line := range strings.Split(out, "\n") {
		if m := chainHeaderRE.FindStringSubmatch(line); m != nil {
			chain = m[1]
			continue
		}
		if m := handleRE.FindStringSubmatch(line); m != nil && chain != "" {
			rules[m[1]] = append(rules[m[1]], upstreamRule{chain, m[2]})
		}
	}
	return rules
}

func contains(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func sortedKinds(m map[string]*plan.Plan) []string { return sortedStrings(m) }

func sortedChainNames(m map[string]string) []string { return sortedStrings(m) }

func sortedStrings[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
