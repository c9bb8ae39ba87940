// Package iptables is the iptables backend: the upstream portmap plugin's
// rule layout in the nat table, applied in the steady state with one
// nf_tables transaction per family on iptables-nft (pkg/xt/native.go), or one
// iptables-restore.
//
//	PREROUTING, OUTPUT:   -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
//	CNI-HOSTPORT-DNAT:    -m comment --comment 'dnat name: "net" id: "cid"'
//	                      -m multiport -p tcp --destination-ports 8080,8443
//	                      [conditions] -j CNI-DN-<hash(net, cid)>     (one per attachment)
//	CNI-DN-<hash>:        -p tcp --dport 8080 -s <container subnet> -j CNI-HOSTPORT-SETMARK   (hairpin)
//	                      -p tcp --dport 8080 -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK         (localhost, IPv4)
//	                      -p tcp --dport 8080 [-d hostIP] -j DNAT --to-destination 192.0.2.2:80
//	CNI-HOSTPORT-SETMARK: -j MARK --set-xmark 0x2000/0x2000
//	POSTROUTING:          -j CNI-HOSTPORT-MASQ   (at the top)
//	CNI-HOSTPORT-MASQ:    -m mark --mark 0x2000/0x2000 -j MASQUERADE
//	CNI-HOSTPORT-BIT13:   (empty) exists once bit 13's SETMARK and MASQ rules were ensured
//
// ADD's fast path is one transaction (nf_tables netlink, or an
// iptables-restore) that flushes the mark bit's empty marker chain
// (failing unless the bit's shared rules were ensured), creates the
// attachment's chain (which fails if it exists) and inserts its entry
// rules: it never lists, checks (-C) or rewrites other attachments'
// rules, whatever the number of containers. When it fails (fresh node,
// re-ADD, leftovers) the slow path runs under the host-wide lock as a
// pass's repair of the one attachment (sync.go): one listing of the
// table; the shared chains it lacks, with the rules that cannot exist
// without them, go into one iptables-restore with the attachment's chain
// re-declared and filled, its entry rules on top, its marker chain last;
// the other shared rules are checked and inserted before it, one by one
// (racing writers never duplicate them).
package iptables

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// Backend applies plans of one family.
type Backend struct {
	Family plan.Family
	Kernel xt.Kernel
	// Lock takes the host-wide lock for the slow paths.
	Lock func() (release func(), err error)
}

// New returns the backend of family f on the real kernel. It fails when the
// family's iptables-restore is not on PATH.
func New(f plan.Family) (*Backend, error) {
	k, err := newExecKernel(f, Table)
	if err != nil {
		return nil, err
	}
	return &Backend{
		Family: f,
		Kernel: k,
		Lock:   lock.Host,
	}, nil
}

// Apply installs the plan, replacing whatever the attachment had.
func (b *Backend) Apply(p *plan.Plan) error {
	if p.ContainerNet == nil {
		return errors.New("no container address to forward to")
	}
	if err := b.markChainExists(p); err != nil {
		return err
	}
	l := layoutOf(p)
	if b.skeletonStands(l) {
		if err := b.fastAdd(l); err == nil || !Missed(err) {
			return err
		}
	}
	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	// The slow path is a pass's repair of this one attachment: one
	// listing; the shared objects it relies on, those the listing lacks
	// in the restore, the rest checked and inserted; its chain replaced
	// and its entry rules moved to the top; its marker chain last.
	lines, err := b.Kernel.ListTable()
	if err != nil {
		return fmt.Errorf("list table %s: %w", Table, err)
	}
	st := listed(b.Family, []*plan.Plan{p}, []*layout{l}, lines)
	st.op, st.sharedBroken = "apply", "not read: ADD's slow path ensures them"
	_, err = b.writeSync(st, converge.Repair[string]{Broken: map[int]bool{0: true}})
	return err
}

// markChainExists fails, before anything is written, when the plan's
// hairpin rules would jump to an externalSetMarkChain that the nat table
// lacks: its restore would fail on a chain the node never had.
// kube-proxy makes KUBE-MARK-MASQ in its iptables mode only; in its
// nftables mode, as since KEP-3178, that chain is its own business.
func (b *Backend) markChainExists(p *plan.Plan) error {
	chain := p.Masquerade.ExternalSetMarkChain
	if chain == "" || !p.Masquerade.Enabled {
		return nil
	}
	found, err := b.Kernel.Chains(Table, []string{chain}, false)
	if errors.Is(err, xt.ErrLegacy) {
		var lines []string
		lines, err = b.Kernel.ListTable()
		found = map[string]xt.ChainSummary{}
		if slices.Contains(lines, "-N "+chain) {
			found[chain] = xt.ChainSummary{}
		}
	}
	if err != nil {
		return fmt.Errorf("read chain %s: %w", chain, err)
	}
	if _, ok := found[chain]; ok {
		return nil
	}
	return missingMarkChain(b.Family, chain)
}

// missingMarkChain is the error of an externalSetMarkChain the nat table
// of family f lacks: the key, why, and the fix.
func missingMarkChain(f plan.Family, chain string) *plan.ConfigError {
	why := fmt.Sprintf("the %s nat table has no chain %s for the hairpin rules to jump to", f, chain)
	if chain == "KUBE-MARK-MASQ" {
		why += " (kube-proxy makes it in its iptables mode only; in nftables mode it keeps its masquerade mark to itself)"
	}
	return &plan.ConfigError{Key: "externalSetMarkChain", Value: chain,
		Why: why + "; remove the key: the plugin's own mark chain (markMasqBit) masquerades the same connections"}
}

// fastAdd writes an attachment that has no chain yet, assuming the
// shared chains and rules: over nf_tables netlink when they were read
// there (skeletonStands: the node's iptables is iptables-nft) and its
// rules are ones pkg/xt/native.go writes (no process; it
// reads no rule, so it costs the same beside 1000 attachments as beside
// none), else in one iptables-restore (addPayload). Either fails as
// Refused when the node is not in the state it assumes.
func (b *Backend) fastAdd(l *layout) error {
	err := b.Kernel.AddChain(l.marker.Name, l.chain, l.rules, l.entries, l.setMark)
	// the kernel's no to what pkg/xt/native.go encodes (EINVAL, EOPNOTSUPP: an
	// expression or an xt revision it takes otherwise) is no failure
	// where iptables-restore, which picks what the kernel has, would have
	// worked: it writes the same. A missing xt revision itself nft_compat
	// answers with ENOENT, which Refused already sends down the slow
	// path; permission is refused to the tool as well.
	if errors.Is(err, xt.ErrLegacy) || errors.Is(err, xt.ErrNotNative) || kernelNo(err) {
		pl := addPayload(l)
		if err = b.Kernel.Restore(pl.bytes()); err != nil && !Missed(err) {
			return b.restoreError("apply", pl, err)
		}
	}
	if err != nil && !Missed(err) {
		return fmt.Errorf("apply: %w", err)
	}
	return err
}

// kernelNo reports whether err is the kernel refusing the native path's
// batch for a reason of its own: neither the fast path's assumption
// broken (Refused) nor a want of permission.
func kernelNo(err error) bool {
	var ne *nfnl.Error
	return errors.As(err, &ne) && !Missed(err) && !errors.Is(ne, unix.EPERM) && !errors.Is(ne, unix.EACCES)
}

// skeletonStands reports whether the shared rules ADD's fast path takes
// for granted are there. The fast path's marker chain says they were
// made, but a flush of the table (`iptables -t nat -F`) empties every
// chain and deletes none, the marker included: on iptables-nft the rules
// themselves are read over netlink, as STATUS and CHECK read them
// (skeleton: nothing that grows with the attachments). On
// iptables-legacy, or when netlink fails, the marker alone decides.
func (b *Backend) skeletonStands(l *layout) bool {
	missing, _, err := b.skeleton(l.shared)
	return err != nil || missing == ""
}

// Remove deletes the attachment's chain and entry rules; it is idempotent.
// Unless an iptables-legacy table is in use, it does so over netlink (the
// rules iptables-nft makes are nf_tables rules), in one transaction and no
// process, and writes nothing when the chain is not there (a family the
// container never had, a second DEL). With iptables-legacy, when the plan
// has mappings, it first tries to delete exactly the rules ADD made, in
// one process. Otherwise (or when either fails) it looks them up.
func (b *Backend) Remove(p *plan.Plan) error {
	chain := ChainName(p.Owner)
	_, err := b.Kernel.Unlink(TopLevelDNATChain, chain)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, xt.ErrLegacy):
		if !p.Empty() {
			pl := delPayload(chain, EntryRules(p), nil)
			if err := b.Kernel.Restore(pl.bytes()); err == nil {
				return nil
			} else if !Missed(err) {
				return b.restoreError("remove", pl, err)
			}
		}
	case !unlinkMissed(err):
		return fmt.Errorf("remove chain %s: %w", chain, err)
	}
	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	refs, exists, err := b.refs(chain)
	if err != nil {
		return err
	}
	if len(refs) == 0 && !exists {
		return nil // nothing of the attachment: change nothing
	}
	pl := delPayload(chain, nil, refs)
	if err := b.Kernel.Restore(pl.bytes()); err != nil {
		return b.restoreError("remove", pl, err)
	}
	return nil
}

// Check verifies that everything ADD made is there. Over nf_tables
// netlink it reads no table: the shared rules as STATUS and ADD judge them
// (the built-in chains' jumps, the mark and masquerade chains not empty,
// the localhost guard), the attachment's chain and the number of rules
// that jump to it from one get and one dump of that chain alone, then
// the chain's rules exactly from one listing of that chain (one process).
// Entry rules with conditions, which only iptables can compare, are
// checked by -C in one restore. CHECK costs the same beside 1000
// containers as beside none. On iptables-legacy it judges one listing
// of the table.
func (b *Backend) Check(p *plan.Plan) error {
	l := layoutOf(p)
	// CNI-HOSTPORT-DNAT, whose rules grow with the attachments, only
	// whether it exists; the attachment's chain with its rules.
	top, err := b.Kernel.Chains(Table, []string{TopLevelDNATChain}, false)
	if errors.Is(err, xt.ErrLegacy) {
		return b.checkListing(l)
	}
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if _, ok := top[TopLevelDNATChain]; !ok {
		return fmt.Errorf("missing chain %s in table %s", TopLevelDNATChain, Table)
	}
	chains, err := b.Kernel.Chains(Table, []string{l.chain}, true)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	r := netlinkRead(chains, l.chain)
	if !r.found {
		return errors.New(l.judge(b.Family, r))
	}
	missing, _, err := b.skeleton(l.shared)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if missing != "" {
		return fmt.Errorf("shared rules: %s", missing)
	}
	if len(p.Conditions) > 0 {
		pl := newPayload()
		for _, r := range l.entries {
			pl.rule("-C", r)
		}
		if err := b.checkRestore(pl); err != nil {
			return err
		}
	}
	why := l.judge(b.Family, r)
	if why == l.notAsWritten() {
		// judged from iptables' listing, which also names what differs
		lines, err := b.Kernel.ListChain(l.chain)
		if err != nil {
			return fmt.Errorf("check: %w", err)
		}
		r.listed, r.lines = true, parseListing(lines).rules[l.chain]
		why = l.judge(b.Family, r)
	}
	if why != "" {
		return errors.New(why)
	}
	return nil
}

// checkRestore runs a payload of -C lines and names the first object it
// finds missing.
func (b *Backend) checkRestore(pl *payload) error {
	if err := b.Kernel.Restore(pl.bytes()); err != nil {
		var re *xt.RestoreError
		if errors.As(err, &re) {
			if what := pl.explain(re.Output); what != "" {
				table := Table
				if what == "chain "+GuardChain {
					table = "filter"
				}
				return fmt.Errorf("missing %s in table %s", what, table)
			}
		}
		return fmt.Errorf("check: %w", err)
	}
	return nil
}

// checkListing is CHECK on iptables-legacy, whose tables nf_tables
// netlink cannot read: the -C restore of the shared rules, then one
// listing of the table (one process) to judge the attachment's chain and
// the entry rules that jump to it.
func (b *Backend) checkListing(l *layout) error {
	if err := b.checkRestore(checkPayload(l)); err != nil {
		return err
	}
	lines, err := b.Kernel.ListTable()
	if err != nil {
		return fmt.Errorf("check: list table %s: %w", Table, err)
	}
	lt := parseListing(lines)
	if !lt.chains[TopLevelDNATChain] {
		return fmt.Errorf("missing chain %s in table %s", TopLevelDNATChain, Table)
	}
	if why := l.judge(b.Family, lt.read(l.chain)); why != "" {
		return errors.New(why)
	}
	return nil
}

// refs returns the rules that jump to the attachment's chain (ours, or the
// upstream plugin's for the same container) and whether the chain exists.
// It lists the whole table in one process: slow paths only.
func (b *Backend) refs(chain string) (refs []string, exists bool, err error) {
	lines, err := b.Kernel.ListTable()
	if err != nil {
		return nil, false, fmt.Errorf("list table %s: %w", Table, err)
	}
	for _, l := range lines {
		switch {
		case l == "-N "+chain:
			exists = true
		case strings.HasPrefix(l, "-A ") && strings.HasSuffix(l, " -j "+chain):
			refs = append(refs, l)
		}
	}
	return refs, exists, nil
}

func (b *Backend) restoreError(op string, pl *payload, err error) error {
	var re *xt.RestoreError
	if errors.As(err, &re) {
		if what := pl.explain(re.Output); what != "" {
			return fmt.Errorf("%s: %s: %w", op, what, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}
