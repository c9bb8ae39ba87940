package iptables

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// Accept is forwardAccept: rules in iptables' filter table that let an
// attachment's DNAT'd connections through a FORWARD policy of DROP, for
// either backend — an nftables accept in another table cannot overrule a
// drop in this chain, so the accept must live here.
//
//	FORWARD:           -j CNI-HOSTPORT-FWD                              (at the top)
//	CNI-HOSTPORT-FWD:  -m comment --comment 'dnat name: "net" id: "cid"' -j CNI-FW-<hash(net, cid)>
//	CNI-FW-<hash>:     -p tcp -m conntrack --ctstate DNAT --ctorigdstport 8080 [--ctorigdst hostIP]
//	                      --ctreplsrc 192.0.2.2 --ctreplsrcport 80 -j ACCEPT      (one per mapping)
//
// The conntrack match names the flow, both directions: connections that
// were DNATed (so a client dialling the container's address directly
// still meets the policy), from this host port (and host IP) to this
// container's address and port. Docker re-inserts its DOCKER-USER jump
// at the top of FORWARD, so rules there still apply before ours.
type Accept struct {
	Family plan.Family
	Kernel xt.Kernel
	Lock   func() (release func(), err error)
}

// NewAccept returns the forwardAccept rules of family f on the real
// kernel; it fails when the family's iptables-restore is not on PATH.
func NewAccept(f plan.Family) (*Accept, error) {
	k, err := newExecKernel(f, FilterTable)
	if err != nil {
		return nil, err
	}
	return &Accept{Family: f, Kernel: k,
		Lock: lock.Host}, nil
}

// AcceptChainName is the attachment's chain of accept rules.
func AcceptChainName(o plan.Owner) string {
	return chainName(o, forwardChainPrefix)
}

// forwardJump is the shared jump from FORWARD.
var forwardJump = xt.Rule{Table: FilterTable, Chain: "FORWARD", Jump: forwardChain, Insert: true}

// forwardEntry is the attachment's jump from CNI-HOSTPORT-FWD; it depends
// only on the owner, so DEL can name it without a prevResult.
func forwardEntry(o plan.Owner) xt.Rule {
	return xt.Rule{Table: FilterTable, Chain: forwardChain, Comment: entryComment(o), Jump: AcceptChainName(o)}
}

// acceptRules are the attachment's accept rules, one per distinct mapping.
func acceptRules(p *plan.Plan) []xt.Rule {
	chain := AcceptChainName(p.Owner)
	var out []xt.Rule
	seen := map[string]bool{}
	for m := range p.Mappings.All() {
		ct := xt.Conntrack{OrigDstPort: strconv.Itoa(m.HostPort), ReplSrc: p.ContainerNet.IP.String(), ReplSrcPort: strconv.Itoa(m.ContainerPort)}
		if m.HostIP != nil {
			ct.OrigDst = m.HostIP.String()
		}
		r := xt.Rule{Table: FilterTable, Chain: chain, Proto: m.Protocol, Ct: ct, Jump: "ACCEPT"}
		if k := strings.Join(r.Args(), " "); !seen[k] {
			seen[k] = true
			out = append(out, r)
		}
	}
	return out
}

func filterPayload() *payload {
	pl := &payload{}
	pl.line("*"+FilterTable, "table "+FilterTable)
	return pl
}

// Apply adds the attachment's accept rules, replacing what it had. The
// fast path is one iptables-restore that checks the jump from FORWARD and
// creates the attachment's chain (failing if it exists); otherwise, under
// the lock, a pass's repair of the one attachment: one listing, then one
// restore (writeSync).
func (fw *Accept) Apply(p *plan.Plan) error {
	if p.ContainerNet == nil {
		return errors.New("no container address to accept forwarding to")
	}
	chain := AcceptChainName(p.Owner)
	pl := filterPayload()
	pl.rule("-C", forwardJump)
	pl.line("-N "+chain, "new chain "+chain)
	for _, r := range acceptRules(p) {
		pl.rule("-A", r)
	}
	pl.rule("-A", forwardEntry(p.Owner))
	if err := fw.Kernel.Restore(pl.bytes()); err == nil {
		return nil
	} else if !Missed(err) {
		return fmt.Errorf("forwardAccept: %w", err)
	}
	release, err := fw.Lock()
	if err != nil {
		return err
	}
	defer release()
	lines, err := fw.Kernel.ListTable()
	if err != nil {
		return fmt.Errorf("forwardAccept: list table %s: %w", FilterTable, err)
	}
	_, err = fw.writeSync(parseAccept(lines), []*plan.Plan{p}, converge.Repair[string]{Broken: map[int]bool{0: true}})
	return err
}

// Remove deletes the attachment's accept rules; it is idempotent and needs
// no prevResult: the jump and the chain are named by the owner alone.
func (fw *Accept) Remove(p *plan.Plan) error {
	chain := AcceptChainName(p.Owner)
	pl := filterPayload()
	pl.rule("-D", forwardEntry(p.Owner))
	pl.drop(chain, nil)
	if err := fw.Kernel.Restore(pl.bytes()); err == nil {
		return nil
	} else if !Missed(err) {
		return fmt.Errorf("forwardAccept: remove chain %s: %w", chain, err)
	}
	// No jump (or no CNI-HOSTPORT-FWD at all): declaring the chain makes
	// its deletion idempotent.
	pl = filterPayload()
	pl.drop(chain, nil)
	if err := fw.Kernel.Restore(pl.bytes()); err != nil {
		return fmt.Errorf("forwardAccept: remove chain %s: %w", chain, err)
	}
	return nil
}

// Check judges the shared chain and the jump from FORWARD to it, the
// attachment's chain with exactly its accept rules and its one jump, from
// one listing of the filter table (one process), as a pass does (decide).
func (fw *Accept) Check(p *plan.Plan) error {
	lines, err := fw.Kernel.ListTable()
	if err != nil {
		return fmt.Errorf("forwardAccept: check: list table %s: %w", FilterTable, err)
	}
	v := parseAccept(lines).decide([]*plan.Plan{p})
	if len(v.Shared) > 0 {
		return errors.New(v.Shared[0])
	}
	if v.Whys[0] != "" {
		return errors.New(v.Whys[0])
	}
	return nil
}

// fwListing is the filter table's forwardAccept state: its listing, and
// whether CNI-HOSTPORT-FWD exists and FORWARD jumps to it.
type fwListing struct {
	*listing
	chain, jump bool
}

func parseAccept(lines []string) *fwListing {
	return &fwListing{listing: parseTable(lines, forwardChain),
		chain: slices.Contains(lines, "-N "+forwardChain), jump: slices.Contains(lines, "-A FORWARD -j "+forwardChain)}
}

// acceptChains are the listing's CNI-FW chains, sorted.
func (l *fwListing) acceptChains() []string {
	var out []string
	for c := range l.chains {
		if strings.HasPrefix(c, "CNI-"+forwardChainPrefix) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// GC removes the accept rules of network's attachments that are not in
// valid: one listing, one write.
func (fw *Accept) GC(network string, valid []plan.Owner) error {
	ids := map[string]bool{}
	for _, o := range valid {
		ids[o.ContainerID] = true
	}
	release, err := fw.Lock()
	if err != nil {
		return err
	}
	defer release()
	lines, err := fw.Kernel.ListTable()
	if err != nil {
		return fmt.Errorf("list table %s: %w", FilterTable, err)
	}
	l := parseAccept(lines)
	pl := filterPayload()
	for _, chain := range l.acceptChains() {
		o, ok := l.owner(chain)
		if !ok || o.Network != network || ids[o.ContainerID] || chain != AcceptChainName(o) {
			continue
		}
		pl.drop(chain, l.refs[chain])
	}
	if len(pl.what) == 1 {
		return nil
	}
	if err := fw.Kernel.Restore(pl.bytes()); err != nil {
		return fmt.Errorf("forwardAccept gc: %w", err)
	}
	return nil
}

// Sync brings the forwardAccept rules to the wanted plans (those with
// ForwardAccept): one listing of the filter table, at most one write; the
// CNI-FW chains no wanted plan names are orphans. The caller holds the
// host-wide lock.
func (fw *Accept) Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error) {
	return converge.Run(len(want), o, converge.Pass[*fwListing, string]{
		Read: func() (*fwListing, error) {
			lines, err := fw.Kernel.ListTable()
			if err != nil {
				return nil, fmt.Errorf("list table %s: %w", FilterTable, err)
			}
			return parseAccept(lines), nil
		},
		Decide: func(l *fwListing) converge.Verdict[string] { return l.decide(want) },
		Write: func(l *fwListing, fix converge.Repair[string]) (bool, error) {
			return fw.writeSync(l, want, fix)
		},
	})
}

// decide judges each wanted plan's chain, its rules and its one jump,
// the shared chain, and lists the CNI-FW chains no wanted plan names.
func (l *fwListing) decide(want []*plan.Plan) converge.Verdict[string] {
	v := converge.Verdict[string]{Whys: make([]string, len(want))}
	wanted := map[string]bool{}
	for i, p := range want {
		chain := AcceptChainName(p.Owner)
		wanted[chain] = true
		var w, h []ruleID
		for _, r := range acceptRules(p) {
			w = append(w, ruleKey(r))
		}
		for _, line := range l.rules[chain] {
			h = append(h, ruleKey(xt.ParseRule(xt.SplitRule(line))))
		}
		switch {
		case !l.chains[chain]:
			v.Whys[i] = "forwardAccept: chain " + chain + " missing"
		case diff(w, h) != "":
			v.Whys[i] = "forwardAccept: chain " + chain + ": " + diff(w, h)
		case len(l.refs[chain]) != 1:
			v.Whys[i] = fmt.Sprintf("forwardAccept: %d jumps to %s in %s, want 1", len(l.refs[chain]), chain, forwardChain)
		}
	}
	if len(want) > 0 && !(l.chain && l.jump) {
		v.Shared = append(v.Shared, "forwardAccept: chain "+forwardChain+" or the jump to it from FORWARD missing")
	}
	for _, chain := range l.acceptChains() {
		if !wanted[chain] {
			ow, _ := l.owner(chain) // zero: no entry rule names the owner
			v.Candidates = append(v.Candidates, converge.Candidate[string]{Network: ow.Network, ContainerID: ow.ContainerID,
				Object: "chain " + chain + " (forwardAccept)", Handle: chain})
		}
	}
	return v
}

// writeSync writes one restore: the shared chain and the jump from
// FORWARD to it where the listing lacks them (the caller holds the lock,
// so the listing is the table's), the broken plans' chains re-declared
// and filled, the pruned ones dropped.
func (fw *Accept) writeSync(l *fwListing, want []*plan.Plan, fix converge.Repair[string]) (bool, error) {
	pl := filterPayload()
	if fix.Shared || len(fix.Broken) > 0 {
		if !l.chain {
			pl.line("-N "+forwardChain, "new chain "+forwardChain)
		}
		if !l.jump {
			pl.rule("-I", forwardJump)
		}
	}
	for i, p := range want {
		if !fix.Broken[i] {
			continue
		}
		chain := AcceptChainName(p.Owner)
		pl.redeclare(chain, l.refs[chain])
		for _, r := range acceptRules(p) {
			pl.rule("-A", r)
		}
		pl.rule("-A", forwardEntry(p.Owner))
	}
	for _, chain := range fix.Prune {
		pl.drop(chain, l.refs[chain])
	}
	if len(pl.what) == 1 {
		return false, nil
	}
	if err := fw.Kernel.Restore(pl.bytes()); err != nil {
		return false, fmt.Errorf("forwardAccept sync: %w", err)
	}
	return true, nil
}

// Ready reports whether the accept rules can be written: the restore tool
// may change the filter table. The write probe answers where it can
// (Backend.Ready), else --test, which commits nothing.
func (fw *Accept) Ready(*plan.Plan) error {
	if err := fw.Kernel.Writable(); !errors.Is(err, nfnl.ErrNoProbe) {
		return err
	}
	return fw.Kernel.Test(filterPayload().bytes())
}

// Mappings is empty: the accept rules forward no host port themselves.
func (fw *Accept) Mappings() ([]plan.Installed, error) { return nil, nil }
