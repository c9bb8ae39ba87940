package iptables

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// listing is a table as iptables -S prints it, by chain: the nat
// table's (parseListing) or the filter table's forwardAccept chains
// (parseAccept).
type listing struct {
	chains map[string]bool
	rules  map[string][]string // chain -> its "-A" lines
	// refs are the rules of the entry chain (CNI-HOSTPORT-DNAT,
	// CNI-HOSTPORT-FWD) by the chain they jump to.
	refs map[string][]string
}

func parseListing(lines []string) *listing { return parseTable(lines, TopLevelDNATChain) }

func parseTable(lines []string, entry string) *listing {
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
		if chain != entry {
			continue
		}
		if i := strings.LastIndex(l, " -j "); i > 0 {
			to := l[i+4:]
			lt.refs[to] = append(lt.refs[to], l)
		}
	}
	return lt
}

// owner is the owner the first entry rule that jumps to chain and names
// one in its comment names; read when asked, as most callers ask none.
func (lt *listing) owner(chain string) (plan.Owner, bool) {
	for _, l := range lt.refs[chain] {
		if m := entryOwnerRE().FindStringSubmatch(l); m != nil {
			return plan.Owner{Network: m[1], ContainerID: m[2]}, true
		}
	}
	return plan.Owner{}, false
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
	case len(have) == 0 && len(missing) > 0:
		return fmt.Sprintf("missing rule %q: all %d rules missing", fmt.Sprint(missing[0]), len(want))
	case len(missing) > 0:
		return fmt.Sprintf("missing rule %q: %d of %d rules missing or wrong", fmt.Sprint(missing[0]), len(missing), len(want))
	case extra > 0:
		return fmt.Sprintf("%d unexpected rules", extra)
	}
	return ""
}

// ruleID is what identifies a rule of ours, in the same spelling for our
// rules and for iptables -S output: addresses with their prefix length,
// and only the fields our rules use (conditions are judged by -C).
type ruleID struct {
	neg                         bool
	src, dst, proto, dport      string
	dports, comment, target, to string
	ct                          xt.Conntrack
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
	if r.ct != (xt.Conntrack{}) {
		add("--ctstate", "DNAT")
	}
	add("--ctorigdst", r.ct.OrigDst)
	add("--ctorigdstport", r.ct.OrigDstPort)
	add("--ctreplsrc", r.ct.ReplSrc)
	add("--ctreplsrcport", r.ct.ReplSrcPort)
	add("-j", r.target)
	add("--to-destination", r.to)
	return strings.Join(parts, " ")
}

// ruleKey is r's identity.
func ruleKey(r xt.Rule) ruleID {
	ct := r.Ct
	ct.OrigDst, ct.ReplSrc = withPrefix(ct.OrigDst), withPrefix(ct.ReplSrc)
	return ruleID{neg: slices.Contains(r.Matches, "!"), src: anyIsNone(withPrefix(r.Src)), dst: anyIsNone(withPrefix(r.Dst)),
		proto: string(r.Proto), dport: r.Dport, dports: r.Dports, comment: r.Comment, target: r.Jump, to: r.To, ct: ct}
}

// entryKey identifies an entry rule without its conditions.
func entryKey(r xt.Rule) ruleID {
	return ruleID{proto: string(r.Proto), dports: r.Dports, comment: r.Comment, target: r.Jump}
}

// anyIsNone drops a match of every address (masqAll's "-s 0.0.0.0/0"):
// iptables takes it and lists the rule without it.
func anyIsNone(prefix string) string {
	if prefix == "0.0.0.0/0" || prefix == "::/0" {
		return ""
	}
	return prefix
}

func withPrefix(addr string) string {
	if addr == "" || strings.Contains(addr, "/") {
		return addr
	}
	if ip := net.ParseIP(addr); ip != nil && ip.To4() == nil {
		return addr + "/128"
	}
	return addr + "/32"
}

// orphan is a CNI-DN chain no wanted plan names, with its owner as its
// entry rule names it ("": no entry rule does).
type orphan struct{ chain, network, id string }

// orphans are the CNI-DN chains no wanted plan names, sorted.
func (lt *listing) orphans(wanted map[string]bool) []orphan {
	var names []string
	for c := range lt.chains {
		if strings.HasPrefix(c, dnChain) && !wanted[c] {
			names = append(names, c)
		}
	}
	sort.Strings(names)
	out := make([]orphan, 0, len(names))
	for _, c := range names {
		o, _ := lt.owner(c) // zero: no entry rule names the owner
		out = append(out, orphan{chain: c, network: o.Network, id: o.ContainerID})
	}
	return out
}
