package nftables

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// layout is what one attachment owns in its family's table, computed
// once from its plan, and the skeleton it relies on. ADD writes it
// (create, or rewriteChain and place), CHECK and the pass judge what
// they read by it (judge).
type layout struct {
	family plan.Family
	chain  *nft.Chain
	// flat is its shape, decided here alone (flatShape): its keys are
	// DNAT map elements and its chain holds a claim rule each (flat.go);
	// otherwise its chain holds its DNAT rules and its keys are verdict
	// map elements.
	flat     bool
	rules    []*nft.Rule
	keys     []Key
	elements []Element
	hairpins []Hairpin
	// lengths are the prefix lengths of a flat attachment's hairpin sets.
	lengths []int
	needs   needs
}

// needs is what of the skeleton an attachment relies on beyond the
// table, its maps and the dispatch and base chains: the mark and
// masquerade chains of its mark bit, the guard of localhost connections.
type needs struct {
	masq     bool
	markBit  int
	localNet bool
}

func (n needs) String() string {
	return strconv.FormatBool(n.masq) + "/" + strconv.Itoa(n.markBit) + "/" + strconv.FormatBool(n.localNet)
}

// layoutOf lays p's attachment out. A plan without a container address
// (DEL without prevResult) has keys and no rule or target.
func layoutOf(p *plan.Plan) *layout {
	runs := p.Runs()
	l := &layout{
		family: p.Family,
		chain:  ownChain(p),
		flat:   flatShape(p, runs),
		needs:  needs{masq: p.Masquerade.Enabled, markBit: p.Masquerade.MarkBit, localNet: p.LocalNet()},
	}
	runs = dnatRuns(runs)
	l.keys = make([]Key, 0, len(runs))
	l.elements = make([]Element, 0, len(runs))
	var srcs []string
	var to netip.Addr // a flat element's target address
	if l.flat {
		srcs = hairpinSrcs(p)
		if p.ContainerNet != nil {
			to = addrOf(p.ContainerNet.IP)
		}
	}
	for _, r := range runs {
		k := runKey(r)
		k.Flat = l.flat
		l.keys = append(l.keys, k)
		e := Element{Key: k, Chain: l.chain.Name}
		if to.IsValid() {
			e.To, e.Srcs = netip.AddrPortFrom(to, uint16(r.ContainerPort)), srcs
		}
		l.elements = append(l.elements, e)
	}
	switch {
	case l.flat:
		l.rules = claimRules(l.chain.Name, l.keys)
		for _, k := range l.keys {
			for _, src := range srcs {
				l.hairpins = append(l.hairpins, Hairpin{Src: src, Key: k, Chain: l.chain.Name})
			}
		}
		for _, src := range srcs {
			ones, _ := nft.ParsePrefix(src).Mask.Size()
			l.lengths = append(l.lengths, ones)
		}
		slices.Sort(l.lengths)
		l.lengths = slices.Compact(l.lengths)
		slices.Reverse(l.lengths)
	case p.ContainerNet != nil:
		l.rules = chainRules(p, runs)
	}
	return l
}

// hairpinsOf are the hairpin elements of the keys won says the
// attachment holds (of one port each).
func (l *layout) hairpinsOf(won func(Key) bool) []Hairpin {
	var out []Hairpin
	for _, h := range l.hairpins {
		if won(h.Key.port()) {
			out = append(out, h)
		}
	}
	return out
}

// create is ADD's fast path: one transaction that creates everything l
// owns, failing if its chain exists, another attachment holds a key or
// the maps are missing.
func (l *layout) create() *nft.Tx {
	tx := newTx(l.family)
	tx.Grow(2 + len(l.rules) + len(l.elements) + len(l.hairpins))
	tx.Create(l.chain)
	for _, r := range l.rules {
		tx.Add(r)
	}
	if l.flat {
		tx.Create(ownerObj{l.chain.Name})
	}
	for _, e := range l.elements {
		tx.Create(e)
	}
	for _, h := range l.hairpins {
		tx.Create(hairpinObj{h})
	}
	return tx
}

// rewriteChain makes the chain, as read in c (nil: absent), hold exactly
// its rules and a flat attachment's owners element (and drops the claims
// of a chain that was flat).
func (l *layout) rewriteChain(tx *nft.Tx, c *ChainState) {
	tx.Add(l.chain)
	tx.Flush(l.chain)
	if !l.flat {
		dropClaims(tx, l.chain.Name, c)
	}
	for _, r := range l.rules {
		tx.Add(r)
	}
	if l.flat {
		tx.Add(ownerObj{l.chain.Name})
	}
}

// probes are what ADD's fast path reads besides its own chain: the
// shared chains and sets a flat attachment relies on without jumping to
// them, and its keys in both kinds of map.
func (l *layout) probes() (chains, sets []string, keys []Key) {
	if l.flat {
		if l.needs.masq {
			chains = append(chains, masqChain(flatMarkBit))
		}
		if l.needs.localNet {
			chains = append(chains, GuardChain)
		}
		sets = flatSetNames(l.lengths)
	}
	return chains, sets, withOtherMaps(l.keys)
}

// hasRanges reports whether the attachment holds an interval key.
func (l *layout) hasRanges() bool {
	for _, k := range l.keys {
		if k.IsRange() {
			return true
		}
	}
	return false
}

// flatShape reports whether the attachment of p, whose runs are runs,
// is flat (flat.go): no conditions (which need a chain to run in), no
// identity range of ports (an interval key, ranges.go), marking with the
// dispatch chain's bit, at most flatMax mappings.
func flatShape(p *plan.Plan, runs []plan.Run) bool {
	if len(p.Conditions) > 0 || p.Mappings.Len() > flatMax {
		return false
	}
	if p.Masquerade.Enabled && p.Masquerade.MarkBit != flatMarkBit {
		return false
	}
	for _, r := range runs {
		if r.Len > 1 && r.Identity() {
			return false
		}
	}
	return true
}

// ports are the keys the attachment's ports are won by: its keys of one
// port, and each port of its intervals as a key of one port.
func (l *layout) ports() []Key {
	out := make([]Key, 0, len(l.keys))
	for _, k := range l.keys {
		for port := k.Port; port <= k.last(); port++ {
			out = append(out, Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: port})
		}
	}
	return out
}

// dnatRuns splits the runs with an offset into single mappings.
func dnatRuns(runs []plan.Run) []plan.Run {
	out := make([]plan.Run, 0, len(runs))
	for _, r := range runs {
		if r.Len == 1 || r.Identity() {
			out = append(out, r)
			continue
		}
		for _, m := range r.Mappings() {
			out = append(out, plan.Run{HostIP: m.HostIP, Protocol: m.Protocol, HostPort: m.HostPort, ContainerPort: m.ContainerPort, Len: 1})
		}
	}
	return out
}

// runKey is the key of a run dnatRuns returns.
func runKey(r plan.Run) Key {
	k := Key{HostIP: addrOf(r.HostIP), Protocol: r.Protocol, Port: r.HostPort}
	if r.Len > 1 {
		k.Last = r.Last()
	}
	return k
}

// kindOf is 1 for a run on a specific host IP, 0 for the wildcard.
func kindOf(r plan.Run) int {
	if r.HostIP != nil {
		return 1
	}
	return 0
}

// mapMin is the number of single mappings of one host IP kind from which
// their DNAT is one rule and a map: below it, a rule each costs the
// kernel less than a map, and reads as the mappings do in nft's listing.
const mapMin = 8

// mapComment comments the DNAT map rule of a host IP kind.
func mapComment(addr bool) string {
	if addr {
		return "hostports by address"
	}
	return "hostports"
}

// chainRules are the rules of a chain attachment's chain, which only its
// own keys' elements lead to: so the hairpin and localhost marks match no
// port. Then one DNAT rule per run (dnatRuns; an identity range keeps
// the port, as nft has no shifted port range), commented with its key;
// from mapMin single mappings of a host IP kind, without conditions,
// one rule and a map of its own for them (dnatMap), before the ranges'
// rules, as the dispatch finds a port before an interval. The
// conditions lead every rule.
func chainRules(p *plan.Plan, runs []plan.Run) []*nft.Rule {
	chain := ChainName(p.Owner)
	var cond []nft.Stmt
	if len(p.Conditions) > 0 {
		cond = []nft.Stmt{nft.Conditions{Nft: strings.Join(p.Conditions, " ")}}
	}
	with := func(more ...nft.Stmt) []nft.Stmt { return append(append([]nft.Stmt(nil), cond...), more...) }
	var rules []*nft.Rule
	if p.Masquerade.Enabled && !p.Empty() {
		setMark := nft.Jump{To: markChain(p.Masquerade.MarkBit)}
		rules = append(rules, &nft.Rule{Chain: chain, Comment: hairpinRule,
			Stmts: with(nft.Addr{Spec: p.HairpinSource()}, setMark)})
		if p.LocalhostRule() {
			rules = append(rules, &nft.Rule{Chain: chain, Comment: localhostRule,
				Stmts: with(nft.Addr{Spec: "127.0.0.1"}, setMark)})
		}
	}
	// not with conditions, which nft compiles: nft before 1.0 (Debian
	// 11's 0.9.8) cannot parse a DNAT by map of a concatenation
	var n [2]int
	for _, r := range runs {
		if r.Len == 1 {
			n[kindOf(r)]++
		}
	}
	mapped := [2]bool{n[0] >= mapMin && cond == nil, n[1] >= mapMin && cond == nil}
	for kind := range n {
		if !mapped[kind] {
			continue
		}
		m := dnatMap{addr: kind == 1, to: p.ContainerNet.IP, entries: make([]mapEntry, 0, n[kind])}
		for _, r := range runs {
			if r.Len == 1 && kindOf(r) == kind {
				m.entries = append(m.entries, mapEntry{runKey(r), r.ContainerPort})
			}
		}
		rules = append(rules, &nft.Rule{Chain: chain, Comment: mapComment(m.addr), Stmts: with(m)})
	}
	rules = slices.Grow(rules, len(runs))
	for _, run := range runs {
		if run.Len == 1 && mapped[kindOf(run)] {
			continue
		}
		stmts := make([]nft.Stmt, 0, len(cond)+4)
		stmts = append(append(stmts, cond...), nft.L4Proto{Name: string(run.Protocol)}, nft.DPort{Port: run.HostPort, Last: run.Last()})
		if run.HostIP != nil {
			stmts = append(stmts, nft.Addr{Dst: true, Spec: run.HostIP.String()})
		}
		port := run.ContainerPort
		if run.Len > 1 {
			port = 0 // an identity range: the port stays
		}
		target := nft.DNAT{To: netip.AddrPortFrom(addrOf(p.ContainerNet.IP), uint16(port))}
		rules = append(rules, &nft.Rule{Chain: chain, Comment: keyComment + runKey(run).String(),
			Stmts: append(stmts, target)})
	}
	return rules
}

// hairpinSrcs are the sources p's connections are masqueraded from, as
// CIDRs: its hairpin source and, where localhost connections are DNATed,
// 127.0.0.1.
func hairpinSrcs(p *plan.Plan) []string {
	if !p.Masquerade.Enabled || p.ContainerNet == nil {
		return nil
	}
	out := []string{nft.ParsePrefix(p.HairpinSource()).String()}
	if p.LocalhostRule() {
		out = append(out, "127.0.0.1/32")
	}
	return out
}

// claimRules are the rules of a flat attachment's chain that claim its
// keys: each matches its key, and does nothing.
func claimRules(chain string, keys []Key) []*nft.Rule {
	out := make([]*nft.Rule, 0, len(keys))
	for _, k := range keys {
		stmts := []nft.Stmt{nft.L4Proto{Name: string(k.Protocol)}, nft.DPort{Port: k.Port, Last: 0}}
		if k.HostIP.IsValid() {
			stmts = append(stmts, nft.Addr{Dst: true, Spec: k.HostIP.String()})
		}
		out = append(out, &nft.Rule{Chain: chain, Comment: claimComment + k.String(), Stmts: stmts})
	}
	return out
}

func ownChain(p *plan.Plan) *nft.Chain {
	return &nft.Chain{Name: ChainName(p.Owner), Comment: ownerComment(p.Owner)}
}

// ownerComment is the attachment chain's comment: who owns it (nft allows
// 128 characters; longer names are cut, the chain name stays exact).
func ownerComment(o plan.Owner) string {
	c := fmt.Sprintf("net=%s id=%s if=%s", o.Network, o.ContainerID, o.IfName)
	if len(c) > 128 {
		c = c[:128]
	}
	return c
}

// addrOf is ip as a key's host IP (an IPv4 address in 4 bytes); the
// zero Addr for nil.
func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}
