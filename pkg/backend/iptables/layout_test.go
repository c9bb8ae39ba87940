package iptables

import (
	"slices"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/test/fixture"
)

// The one judge of an attachment, over each kind of read a verb makes:
// the chain and the rules that jump to it over nf_tables netlink (CHECK,
// the pass's steady read), the chain alone as iptables lists it (CHECK
// naming what differs), the whole table listed (the pass, iptables-legacy).
func TestLayoutJudge(t *testing.T) {
	p := fixture.TestPlan(plan.IPv4, func(r *plan.Request) {
		r.Mappings = plan.Mappings{}
		r.Mappings.Add(plan.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP})
		r.Mappings.Add(plan.Mapping{HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP, HostIP: fixture.HostIP})
	})
	l := layoutOf(p)
	if len(l.rules) == 0 || len(l.entries) != 2 || l.marker.Name != MarkerChain(p.Masquerade.MarkBit) || l.setMark != SetMarkChain {
		t.Fatalf("layout %+v: want the chain's rules, an entry rule per protocol, the marker and the mark chain", l)
	}
	encode := func(l *layout) (exprs [][]byte) {
		for _, r := range l.rules {
			e, _, _, err := xt.EncodeRule(plan.IPv4, r, l.jumps())
			if err != nil {
				t.Fatal(err)
			}
			exprs = append(exprs, e)
		}
		return exprs
	}
	exprs := encode(l)
	listed := func(rules []xt.Rule) (lines []string) {
		for _, r := range rules {
			lines = append(lines, "-A "+r.Chain+" "+xt.QuoteArgs(r.Args()))
		}
		return lines
	}
	other := layoutOf(fixture.Attachment("b", "192.0.2.5/24", 8080, 8053))
	for _, tc := range []struct {
		name string
		read chainRead
		want string // "": judged right; else a part of the message
	}{
		{"netlink: as written", chainRead{found: true, exprs: exprs, refs: 2}, ""},
		{"netlink: no chain", chainRead{refs: 2}, "missing chain " + l.chain + " in table nat"},
		{"netlink: a rule missing", chainRead{found: true, exprs: exprs[1:], refs: 2}, l.notAsWritten()},
		{"netlink: another's rules", chainRead{found: true, exprs: encode(other), refs: 2}, l.notAsWritten()},
		{"netlink: an entry rule missing", chainRead{found: true, exprs: exprs, refs: 1}, "1 rules jump to " + l.chain + ", want 2"},
		{"chain listed, entries counted", chainRead{found: true, listed: true, lines: listed(l.rules), refs: 2}, ""},
		{"chain listed, a rule missing", chainRead{found: true, listed: true, lines: listed(l.rules[1:]), refs: 2}, "chain " + l.chain + ": missing rule"},
		{"chain listed, a rule too many", chainRead{found: true, listed: true, lines: listed(append(slices.Clone(l.rules), other.rules[0])), refs: 2}, "1 unexpected rules"},
		{"table listed", chainRead{found: true, listed: true, lines: listed(l.rules), entriesListed: true, entries: listed(l.entries)}, ""},
		{"table listed, an entry rule missing", chainRead{found: true, listed: true, lines: listed(l.rules), entriesListed: true, entries: listed(l.entries[:1])}, "entry rules in CNI-HOSTPORT-DNAT: missing rule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := l.judge(plan.IPv4, tc.read)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("judge = %q, want %q", got, tc.want)
			}
		})
	}
}
