// Package xt is x_tables as the iptables tools spell it and as the
// iptables backends reach it: a rule in the fields the portmap layouts
// write, a chain, the Kernel seam a backend writes and reads through (the
// restore tool, iptables -S, iptables-nft's nf_tables netlink), and the
// spelling both sides share: the tokens of an iptables -S line, the
// quoting iptables-restore takes, the built-in chains and the targets;
// and iptables-nft's nat table over nf_tables netlink without a process:
// rules written as iptables-nft 1.8.7 writes them (native.go), read back
// and compared whichever release wrote them (netlink.go). xttest holds an
// x_tables in memory behind the same seam.
package xt

import (
	"errors"
	"fmt"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// The tables the layouts write.
const (
	NAT    = "nat"
	Filter = "filter"
)

// Rule is an iptables rule in the fields the layouts use.
type Rule struct {
	Table string // NAT when empty
	Chain string
	// Insert puts the rule at the top of its chain instead of the end.
	Insert bool

	Proto    plan.Protocol // -p
	Dport    string        // --dport, the tcp or udp match: "8080" or "20000:20999"
	Dst, Src string        // -d, -s: an address or a prefix
	Dports   string        // -m multiport --destination-ports: "8080,20000:20999"
	Comment  string        // -m comment --comment
	Ct       Conntrack     // -m conntrack --ctstate DNAT
	// Matches are the other matches, as iptables takes them: the shared
	// rules' (addrtype, mark, conntrack), the forward layer's and the
	// configuration's conditions.
	Matches  []string
	Jump     string // -j: a chain, or DNAT, MARK, MASQUERADE, ACCEPT, DROP
	To       string // DNAT --to-destination
	SetXmark string // MARK --set-xmark
}

// Conntrack is a conntrack match of a DNATed connection: the host port
// (and address) it was sent to, the container's address and port that
// answer it.
type Conntrack struct{ OrigDst, OrigDstPort, ReplSrc, ReplSrcPort string }

// TableName is the rule's table, NAT when it names none.
func (r Rule) TableName() string {
	if r.Table == "" {
		return NAT
	}
	return r.Table
}

// Args spells r's matches and target in the order iptables takes them:
// an entry rule's comment before its multiport match (upstream's order,
// which iptables keeps); else the protocol and port, the addresses, the
// other matches, then the comment.
func (r Rule) Args() []string {
	var a []string
	add := func(v string, opts ...string) {
		if v != "" {
			a = append(append(a, opts...), v)
		}
	}
	comment := func() { add(r.Comment, "-m", "comment", "--comment") }
	if r.Dports != "" {
		comment()
		a = append(a, "-m", "multiport")
		add(string(r.Proto), "-p")
		add(r.Dports, "--destination-ports")
		a = append(a, r.Matches...)
	} else {
		add(string(r.Proto), "-p")
		add(r.Dport, "--dport")
		add(r.Dst, "-d")
		add(r.Src, "-s")
		if r.Ct != (Conntrack{}) {
			a = append(a, "-m", "conntrack", "--ctstate", "DNAT")
			add(r.Ct.OrigDstPort, "--ctorigdstport")
			add(r.Ct.OrigDst, "--ctorigdst")
			add(r.Ct.ReplSrc, "--ctreplsrc")
			add(r.Ct.ReplSrcPort, "--ctreplsrcport")
		}
		a = append(a, r.Matches...)
		comment()
	}
	add(r.Jump, "-j")
	add(r.To, "--to-destination")
	add(r.SetXmark, "--set-xmark")
	return a
}

// Chain is a table's chain.
type Chain struct{ Table, Name string }

// Builtins are the chains each table has before anyone writes to it.
var Builtins = map[string][]string{
	NAT:    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	Filter: {"INPUT", "FORWARD", "OUTPUT"},
}

// Targets are the jumps that are not chains.
var Targets = map[string]bool{"ACCEPT": true, "DROP": true, "RETURN": true, "DNAT": true, "SNAT": true,
	"MASQUERADE": true, "MARK": true, "REJECT": true, "LOG": true}

// JumpOf is the chain or target a rule's tokens jump or go to, or "".
func JumpOf(tokens []string) string {
	for i, tok := range tokens {
		if (tok == "-j" || tok == "-g") && i+1 < len(tokens) {
			return tokens[i+1]
		}
	}
	return ""
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

// QuoteArgs renders tokens for iptables-restore, which splits on blanks
// and groups double-quoted text, with backslash escaping inside quotes:
// SplitRule undoes it. Config validation keeps quotes, backslashes and
// control characters out of conditions; only comments (which we write)
// contain quotes.
func QuoteArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = quoteArg(a)
	}
	return strings.Join(out, " ")
}

func quoteArg(a string) string {
	if a != "" && !strings.ContainsAny(a, " \t\"'\\#") {
		return a
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(a) + `"`
}

// RestoreError is a failed iptables-restore run with what it printed.
type RestoreError struct {
	Output string
	Err    error
	// Refused is true when iptables-restore refused a line of the payload:
	// a chain that exists or a rule that is not there (exit status 1), a
	// chain that is missing (exit status 2, "parameter problem"). Other
	// failures — the xtables lock held past -w, no permission (exit
	// status 4), the tool gone — are not.
	Refused bool
}

func (e *RestoreError) Error() string {
	return fmt.Sprintf("%v: %s", e.Err, strings.TrimSpace(e.Output))
}

func (e *RestoreError) Unwrap() error { return e.Err }

// ErrLegacy says this network namespace has an iptables-legacy table:
// its rules are not nf_tables', and only the tools reach them.
var ErrLegacy = errors.New("iptables-legacy table in use: not reachable over nf_tables netlink")

// ErrNotNative says a rule holds a token the native writer does not
// write; the caller uses iptables-restore.
var ErrNotNative = errors.New("not encoded natively")
