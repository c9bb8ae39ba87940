package iptables

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// payload is an iptables-restore input for the nat table. It remembers what
// each line is for, so that a failing line can be named in an error.
type payload struct {
	b    strings.Builder
	what []string // what[i] describes line i+1
}

func newPayload() *payload {
	p := &payload{}
	p.line("*"+Table, "table "+Table)
	return p
}

// guardPayload starts a payload with a filter section that checks the
// localhost guard; iptables-restore stops at its first failing line, so a
// missing guard keeps the nat section from being applied.
func guardPayload(p *plan.Plan) *payload {
	rules := GuardRules(p)
	if len(rules) == 0 {
		return newPayload()
	}
	pl := &payload{}
	pl.line("*filter", "table filter")
	for _, r := range rules {
		pl.rule("-C", r)
	}
	pl.line("COMMIT", "commit filter")
	pl.line("*"+Table, "table "+Table)
	return pl
}

func (p *payload) line(s, what string) {
	p.b.WriteString(s)
	p.b.WriteByte('\n')
	p.what = append(p.what, what)
}

// rule writes one rule command; cmd is -A, -I, -C or -D.
func (p *payload) rule(cmd string, r xt.Rule) {
	head := cmd + " " + r.Chain
	if cmd == "-I" {
		head += " 1"
	}
	p.line(head+" "+xt.QuoteArgs(r.Args()), "rule "+describe(r))
}

func (p *payload) bytes() []byte {
	p.line("COMMIT", "commit")
	return []byte(p.b.String())
}

// describe names a rule for a person: chain and tokens as iptables -S shows
// them.
func describe(r xt.Rule) string {
	d := strconv.Quote("-A " + r.Chain + " " + strings.Join(r.Args(), " "))
	if r.Table != "" && r.Table != Table {
		d += " (table " + r.Table + ")"
	}
	return d
}

// failedLine matches iptables-restore's diagnostics that name a line: "line
// N failed" (the kernel refused it) and "Error occurred at line: N" (it did
// not parse, e.g. a jump to a missing chain).
var failedLine = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`line:? (\d+)`) })

var missingChain = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`Chain '([^']+)' does not exist`) })

// explain maps an iptables-restore failure to the payload line that caused
// it, or "" when the output names none.
func (p *payload) explain(out string) string {
	// iptables-nft blames COMMIT for a jump to a missing chain; the chain's
	// name says more.
	if m := missingChain().FindStringSubmatch(out); m != nil {
		return "chain " + m[1]
	}
	m := failedLine().FindStringSubmatch(out)
	if m == nil {
		return ""
	}
	n, _ := strconv.Atoi(m[1])
	if n < 1 || n > len(p.what) {
		return ""
	}
	return p.what[n-1]
}

// addPayload is the fast path of ADD for an attachment with no chain yet:
// it checks the localhost guard (filter table: cheap), flushes the mark
// bit's empty marker chain (which fails unless that bit's mark and
// masquerade rules were ensured), creates the attachment's chain (failing
// if it exists), fills it — its jumps fail without the mark chain — and
// inserts the entry rules, which fails without CNI-HOSTPORT-DNAT. It reads
// no rule of the nat table, so its cost does not grow with the number of
// attachments. It succeeds or changes nothing; on failure the caller takes
// the slow path, which ensures everything. What it no longer proves is
// that the jumps from PREROUTING, OUTPUT and POSTROUTING and the bit's
// rules are still there after someone deleted them while our chains
// survived (iptables -t nat -F): CHECK reports that, sync repairs it.
func addPayload(l *layout) *payload {
	pl := guardPayload(l.plan)
	if c := l.marker; c.Name != "" {
		pl.line("-F "+c.Name, "marker chain "+c.Name)
	}
	pl.line("-N "+l.chain, "new chain "+l.chain)
	l.fill(pl)
	return pl
}

// redeclare deletes the rules refs (iptables -S lines that jump to chain)
// and declares chain, which creates it or empties it: what is left is to
// fill it. Declaring also makes a following -X idempotent.
func (pl *payload) redeclare(chain string, refs []string) {
	deleteRefs(pl, refs)
	pl.line(":"+chain+" - [0:0]", "chain "+chain)
}

// drop deletes the rules refs that jump to chain, then chain: whether it
// exists or not, because it is declared first.
func (pl *payload) drop(chain string, refs []string) {
	pl.redeclare(chain, refs)
	pl.line("-X "+chain, "delete chain "+chain)
}

// fill writes the layout's chain's rules and entry rules into pl.
func (l *layout) fill(pl *payload) {
	for _, r := range l.rules {
		pl.rule("-A", r)
	}
	// Each goes to the top; in reverse, so they keep their order.
	for i := len(l.entries) - 1; i >= 0; i-- {
		pl.rule("-I", l.entries[i])
	}
}

// delPayload removes the attachment's chain after the given entry rules:
// either the ones the plan says ADD made (fast path) or the ones found in
// the kernel (iptables -S lines). Declaring the chain before deleting it
// makes the deletion idempotent.
func delPayload(chain string, entries []xt.Rule, refs []string) *payload {
	pl := newPayload()
	for _, r := range entries {
		pl.rule("-D", r)
	}
	pl.drop(chain, refs)
	return pl
}

// deleteRefs turns "-A CHAIN ..." lines as iptables -S prints them (already
// quoted for restore) into deletions.
func deleteRefs(pl *payload, refs []string) {
	for _, ref := range refs {
		if rest, ok := strings.CutPrefix(ref, "-A "); ok {
			pl.line("-D "+rest, "rule "+strconv.Quote(ref))
		}
	}
}

// checkPayload asserts the guard, the shared rules and, with conditions,
// the entry rules exist (iptables -C); it changes nothing. The
// attachment's chain is judged from a listing (Check).
func checkPayload(l *layout) *payload {
	pl := guardPayload(l.plan)
	for _, r := range sharedRules(l.plan) {
		pl.rule("-C", r)
	}
	if len(l.plan.Conditions) > 0 {
		for _, r := range l.entries {
			pl.rule("-C", r)
		}
	}
	return pl
}

// AddScript is the iptables-restore input of ADD's fast path for p (for
// tests and fuzzing of the rendering).
func AddScript(p *plan.Plan) string { return string(addPayload(layoutOf(p)).bytes()) }

// Missed reports whether a fast path's write failed the way it does when
// the node is not in the state it assumes (a fresh node, a re-ADD, a
// missing marker), so the slow path may run: iptables-restore refusing
// a line, or the native writer's EEXIST or ENOENT. Any other error is
// returned to the caller as it is (a kernel test holds the exit statuses
// to this). The nftables backend's word for the same is missed.
func Missed(err error) bool {
	var re *xt.RestoreError
	if errors.As(err, &re) {
		return re.Refused
	}
	// the native fast path: a chain that exists, a chain or table
	// that does not
	var ne *nfnl.Error
	return errors.As(err, &ne) && (errors.Is(ne, unix.EEXIST) || errors.Is(ne, unix.ENOENT))
}

// unlinkMissed reports whether the netlink DEL failed the way its fast
// path may (the slow path then looks the rules up): the chain is still
// referenced from elsewhere (EBUSY), or changed under us (ENOENT).
func unlinkMissed(err error) bool {
	return errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENOENT)
}
