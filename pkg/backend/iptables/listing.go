package iptables

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

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
	if why := judgeChain(p, lt.rules[chain]); why != "" {
		return why
	}
	var want, have []ruleID
	for _, r := range EntryRules(p) {
		want = append(want, entryID(r.Args))
	}
	for _, l := range lt.refs[chain] {
		have = append(have, entryID(SplitRule(l)))
	}
	if d := diff(want, have); d != "" {
		return "entry rules in " + TopLevelDNATChain + ": " + d
	}
	return ""
}

// judgeChain compares the attachment's chain as listed ("-A chain …"
// lines) with what its plan wants; "" when they are the same.
func judgeChain(p *plan.Plan, lines []string) string {
	var want, have []ruleID
	for _, r := range ChainRules(p) {
		want = append(want, idOf(r.Args))
	}
	for _, l := range lines {
		have = append(have, idOf(SplitRule(l)))
	}
	if d := diff(want, have); d != "" {
		return "chain " + ChainName(p.Owner) + ": " + d
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
			r.src = anyIsNone(withPrefix(v))
		case "-d":
			r.dst = anyIsNone(withPrefix(v))
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

// anyIsNone drops a match of every address (masqAll's "-s 0.0.0.0/0"):
// iptables takes it and lists the rule without it.
func anyIsNone(prefix string) string {
	if prefix == "0.0.0.0/0" || prefix == "::/0" {
		return ""
	}
	return prefix
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

// SplitRule splits an iptables -S line into tokens, undoing its quoting
// (double quotes, with backslash escapes inside).
func SplitRule(line string) []string {
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
		o := orphan{chain: c}
		for _, ref := range lt.refs[c] {
			if m := entryOwnerRE().FindStringSubmatch(ref); m != nil && m[3] == c {
				o.network, o.id = m[1], m[2]
				break
			}
		}
		out = append(out, o)
	}
	return out
}

// builtins are the chains each table has without a rule of ours.
var builtins = map[string][]string{
	Table:       {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	FilterTable: {"INPUT", "FORWARD", "OUTPUT"},
}

// targets are the jumps that are not chains.
var targets = map[string]bool{"ACCEPT": true, "DROP": true, "RETURN": true, "DNAT": true, "SNAT": true,
	"MASQUERADE": true, "MARK": true, "REJECT": true, "LOG": true}

// jumpOf is the chain or target a rule's tokens jump or go to, or "".
func jumpOf(tokens []string) string {
	for i, tok := range tokens {
		if (tok == "-j" || tok == "-g") && i+1 < len(tokens) {
			return tokens[i+1]
		}
	}
	return ""
}

// parsePortRange reads "8080" or "20000:20999" (sep between first and
// last).
func parsePortRange(s, sep string) ([2]int, bool) {
	a, b, isRange := strings.Cut(s, sep)
	first, err := strconv.Atoi(a)
	if err != nil {
		return [2]int{}, false
	}
	last := first
	if isRange {
		if last, err = strconv.Atoi(b); err != nil {
			return [2]int{}, false
		}
	}
	return [2]int{first, last}, true
}

// resolveTarget is where a DNAT --to-destination sends a packet to port
// dport: "ip:port" as given; "ip" keeps the port; "ip:first-last/base"
// keeps the offset from base.
func resolveTarget(to string, dport int) string {
	host, port, err := net.SplitHostPort(to)
	if err != nil { // no port
		return net.JoinHostPort(strings.Trim(to, "[]"), strconv.Itoa(dport))
	}
	ports, base, shifted := strings.Cut(port, "/")
	r, ok := parsePortRange(ports, "-")
	if !ok {
		return to
	}
	if shifted {
		b, err := strconv.Atoi(base)
		if err != nil {
			return to
		}
		return net.JoinHostPort(host, strconv.Itoa(r[0]+dport-b))
	}
	return net.JoinHostPort(host, strconv.Itoa(r[0]))
}
