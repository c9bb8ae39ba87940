package nftables

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Sync brings this family's cni_portmap table to the wanted plans (oldest
// first) for `portmap-agent sync`: one listing of the table judges the skeleton
// and every attachment (its chain's rules and the map elements of the keys
// it wins: the newest plan of a key wins), and one transaction re-applies
// what is missing or wrong and, with Prune, removes orphans — dn- chains
// no wanted plan names, with the elements that point at them, and the
// upstream plugin's cni_hostport rules of containers no wanted plan
// names. Attachments that are right are not touched, so a pass after a
// pass writes nothing. The caller holds the host-wide lock.
func (b *Backend) Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error) {
	return converge.Run(len(want), o, converge.Pass[*syncState, orphan]{
		Read:   func() (*syncState, error) { return b.readSync(want) },
		Decide: func(s *syncState) converge.Verdict[orphan] { return s.decide() },
		Write:  b.writeSync,
	})
}

// orphan is what a pass removes of an orphan: a dn- chain of ours, or the
// upstream plugin's rules of a container.
type orphan struct {
	chain, upstreamID string
}

func (b *Backend) readSync(want []*plan.Plan) (*syncState, error) {
	st, err := b.Kernel.Table(b.Family, Table)
	if err != nil {
		return nil, fmt.Errorf("read table: %w", err)
	}
	up, err := b.Kernel.Table(b.Family, upstreamTable)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", upstreamTable, err)
	}
	s := &syncState{family: b.Family, want: want, st: st, up: up, exists: st != nil,
		winner: map[Key]int{}, kinds: map[string]needs{}}
	if st == nil {
		s.st = newState()
	}
	s.hairpins = make(map[hairpinID]Hairpin, len(s.st.Hairpins))
	for _, h := range s.st.Hairpins {
		s.hairpins[h.id()] = h
	}
	var flat []*layout
	s.layouts = make([]*layout, len(want))
	for i, p := range want {
		l := layoutOf(p)
		s.layouts[i] = l
		for _, k := range l.ports() {
			s.winner[k] = i // the newest plan of a port wins it
		}
		s.anyRanges = s.anyRanges || l.hasRanges()
		if l.flat {
			flat = append(flat, l)
		}
		s.kinds[l.needs.String()] = l.needs
	}
	s.flatLengths = lengthsOf(nil, flat...)
	if s.anyRanges {
		s.all = elementsOfState(s.st)
		s.served = newView(s.all)
	}
	return s, nil
}

// decide judges the skeleton, every wanted plan and the orphans.
func (s *syncState) decide() converge.Verdict[orphan] {
	v := converge.Verdict[orphan]{Shared: s.skeleton(),
		Whys: converge.Judge(len(s.want), func(i int) string { return s.judge(i) })}
	wanted, wantedIDs := map[string]bool{}, map[string]bool{}
	for i, p := range s.want {
		wanted[s.layouts[i].chain.Name] = true
		wantedIDs[p.Owner.ContainerID] = true
	}
	for _, name := range slices.Sorted(maps.Keys(s.st.Chains)) {
		if strings.HasPrefix(name, "dn-") && !wanted[name] {
			network, id, _ := s.st.Chains[name].owner()
			v.Candidates = append(v.Candidates, converge.Candidate[orphan]{Network: network, ContainerID: id,
				Object: "chain " + name, Handle: orphan{chain: name}})
		}
	}
	upRules := upstreamRules(s.up)
	for _, id := range slices.Sorted(maps.Keys(upRules)) {
		if !wantedIDs[id] { // upstream's rules name the container only
			v.Candidates = append(v.Candidates, converge.Candidate[orphan]{ContainerID: id,
				Object: fmt.Sprintf("%d rules in table %s", upRules[id], upstreamTable), Handle: orphan{upstreamID: id}})
		}
	}
	return v
}

// skeleton names what every wanted plan relies on and the table lacks.
func (s *syncState) skeleton() []string {
	if len(s.want) == 0 {
		return nil
	}
	if !s.exists {
		return []string{fmt.Sprintf("table %s %s missing", nftFamily(s.family), Table)}
	}
	var shared []string
	for _, m := range dispatchMaps {
		if !s.st.Maps[m.name] {
			shared = append(shared, "map "+m.name+" missing")
		}
	}
	for _, name := range flatSetNames(s.flatLengths) {
		if !s.st.Maps[name] {
			shared = append(shared, "map "+name+" missing")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(s.kinds)) {
		gaps, _ := skeletonGaps(s.family, s.kinds[k], s.flatLengths, s.st.Chains)
		for _, g := range gaps {
			if !slices.Contains(shared, g) {
				shared = append(shared, g)
			}
		}
	}
	return shared
}

// writeSync writes the repair: one transaction for the table, one for
// upstream's rules of pruned containers.
func (b *Backend) writeSync(s *syncState, fix converge.Repair[orphan]) (bool, error) {
	orphanChains, upIDs := map[string]bool{}, map[string]bool{}
	for _, or := range fix.Prune {
		if or.chain != "" {
			orphanChains[or.chain] = true
		} else {
			upIDs[or.upstreamID] = true
		}
	}
	skel, tx := newTx(b.Family), newTx(b.Family)
	// decide names a missing table, and what a flat attachment's repair
	// needs of the skeleton, as shared: it is written whole
	if fix.Shared {
		// the lengths the node has, and those of every wanted plan
		lengths := lengthsOf(s.st.Chains[DispatchChain], s.layouts...)
		for _, k := range slices.Sorted(maps.Keys(s.kinds)) {
			addSkeleton(skel, s.kinds[k], lengths)
		}
	}
	for i, l := range s.layouts {
		if fix.Broken[i] {
			l.rewriteChain(tx, s.st.Chains[l.chain.Name])
		}
	}
	desired, wantHP := s.desiredElements(fix.Broken)
	cutIntervals(s.st, s.all, desired)
	for k, e := range s.st.Elements {
		if _, set := desired[k]; orphanChains[e.Chain] && !set {
			desired[k] = Element{Key: k}
		}
	}
	writeElements(tx, s.st, desired)
	s.writeHairpins(tx, desired, wantHP)
	dropChains(tx, s.st.Chains, orphanChains)
	wrote := skel.Len()+tx.Len() > 0
	if wrote {
		if err := b.applyWith(skel, tx); err != nil {
			return false, fmt.Errorf("sync: %w", err)
		}
	}
	if len(upIDs) > 0 {
		if utx := upstreamTx(b.Family, s.up, upIDs); utx.Len() > 0 {
			if err := b.Kernel.Apply(utx); err != nil {
				return false, fmt.Errorf("sync: %w", err)
			}
			wrote = true
		}
	}
	return wrote, nil
}

// judge says what of wanted plan i the table shows missing or wrong, or
// "" (judge, over the keys plan i wins).
func (s *syncState) judge(i int) string {
	l := s.layouts[i]
	return judge(l, s.st.Chains[l.chain.Name], reading{s.st, s.served, s.hairpins}, func(k Key) bool { return s.wins(k, i) })
}
