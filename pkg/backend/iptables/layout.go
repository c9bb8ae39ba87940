package iptables

import (
	"fmt"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// layout is what one attachment owns in its family's nat table, computed
// once from its plan: its chain and the chain's rules, its entry rules in
// CNI-HOSTPORT-DNAT, and what it relies on — the chain its hairpin rules
// jump to, the shared rules, the marker chain of its mark bit. ADD writes
// it (the native writer, or iptables-restore: addPayload; a pass's repair),
// CHECK and a pass compare what they read with it (judge), DEL deletes
// its chain and the rules that jump there.
type layout struct {
	plan    *plan.Plan
	chain   string
	rules   []xt.Rule // the chain's, in order
	entries []xt.Rule // in CNI-HOSTPORT-DNAT, in order
	setMark string
	marker  xt.Chain // Name "": none (no mark chains of ours)
	shared  []xt.Rule
}

func layoutOf(p *plan.Plan) *layout {
	l := &layout{plan: p, chain: ChainName(p.Owner), rules: ChainRules(p), entries: EntryRules(p),
		setMark: setMarkChainOf(p), shared: skeletonRules(p)}
	l.marker, _ = Marker(p)
	return l
}

// jumps are the chains the layout's rules jump to, as the native encoder
// needs them named.
func (l *layout) jumps() map[string]bool { return xt.JumpSet(l.chain, []string{l.setMark}) }

// chainRead is what a verb read of an attachment's chain: over nf_tables
// netlink its rules as the kernel holds them (exprs) and how many rules
// jump to it (refs); from iptables' listing (listed) its "-A" lines and,
// when the whole table was listed (entriesListed), the rules that jump to
// it.
type chainRead struct {
	found         bool
	exprs         [][]byte
	refs          int
	listed        bool
	lines         []string
	entriesListed bool
	entries       []string
}

// judge says what of the layout's own objects the read shows missing or
// wrong, "" when all of them are there: the one judgment of CHECK and a
// pass, with one set of messages. Rules read over netlink are compared as
// the native writer writes them; a chain that is not is notAsWritten,
// which a listing of the chain judges (another iptables release spells
// some matches otherwise). Entry rules are compared without conditions,
// which only iptables' -C compares.
func (l *layout) judge(f plan.Family, r chainRead) string {
	if !r.found {
		return fmt.Sprintf("missing chain %s in table %s", l.chain, Table)
	}
	if r.listed {
		if d := listedDiff(l.rules, r.lines, ruleKey); d != "" {
			return "chain " + l.chain + ": " + d
		}
	} else if same, _ := xt.SameRules(f, r.exprs, l.rules, l.jumps(), false); !same {
		return l.notAsWritten()
	}
	if r.entriesListed {
		if d := listedDiff(l.entries, r.entries, entryKey); d != "" {
			return "entry rules in " + TopLevelDNATChain + ": " + d
		}
	} else if r.refs != len(l.entries) {
		return fmt.Sprintf("entry rules in %s: %d rules jump to %s, want %d", TopLevelDNATChain, r.refs, l.chain, len(l.entries))
	}
	return ""
}

// listedDiff compares rules with the lines iptables lists, each by its
// identity (key).
func listedDiff(rules []xt.Rule, lines []string, key func(xt.Rule) ruleID) string {
	want, have := make([]ruleID, len(rules)), make([]ruleID, len(lines))
	for i, r := range rules {
		want[i] = key(r)
	}
	for i, s := range lines {
		have[i] = key(xt.ParseRule(xt.SplitRule(s)))
	}
	return diff(want, have)
}

// notAsWritten is judge's word for a chain whose rules, read over netlink,
// are not the native writer's.
func (l *layout) notAsWritten() string {
	return "chain " + l.chain + ": rules not as the native writer writes them"
}

// read is what the listing shows of chain.
func (lt *listing) read(chain string) chainRead {
	return chainRead{found: lt.chains[chain], listed: true, lines: lt.rules[chain], entriesListed: true, entries: lt.refs[chain]}
}

// netlinkRead is what a dump of our chains shows of chain.
func netlinkRead(got map[string]xt.ChainSummary, chain string) chainRead {
	c, ok := got[chain]
	return chainRead{found: ok, exprs: c.Exprs, refs: c.Refs}
}
