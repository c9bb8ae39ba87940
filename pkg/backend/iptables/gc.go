package iptables

import (
	"errors"
	"fmt"
	"slices"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// GC removes every attachment of network that no valid attachment owns.
// Ownership comes from the entry rules' comments, so other networks' rules
// stay, even for the same container ID; the layout has one chain per
// network and container, so the interface name plays no part. It lists the
// table once and removes all stale attachments in one iptables-restore.
func (b *Backend) GC(network string, valid []plan.Owner) error {
	ids := map[string]bool{}
	for _, o := range valid {
		ids[o.ContainerID] = true
	}
	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	lines, err := b.Kernel.ListTable()
	if err != nil {
		return fmt.Errorf("list table %s: %w", Table, err)
	}
	lt := parseListing(lines)
	var order []string // stale chains, sorted
	for chain := range lt.refs {
		// A cut comment (very long names) cannot prove ownership: the
		// chain name must be the one this owner hashes to.
		if o, ok := lt.owner(chain); ok && o.Network == network && !ids[o.ContainerID] && chain == ChainName(o) {
			order = append(order, chain)
		}
	}
	if len(order) == 0 {
		return nil
	}
	slices.Sort(order)
	pl := newPayload()
	for _, chain := range order {
		pl.drop(chain, lt.refs[chain])
	}
	if err := b.Kernel.Restore(pl.bytes()); err != nil {
		return b.restoreError("gc", pl, err)
	}
	return nil
}

// Ready reports whether the backend can serve ADD (of any plan): the
// restore tool (New found it) may change the nat table. Where
// CNI-HOSTPORT-DNAT can be read over nf_tables netlink, an ADD wrote it
// with the tool in this family, and nf_tables answered the read, which
// it does only for CAP_NET_ADMIN: that is the answer, with no process.
// Otherwise (a fresh node, after a flush) the write probe answers
// (Kernel.Writable), with no process either. Only where it cannot
// (iptables-legacy, a tool not known to be iptables-nft's, a kernel
// before Linux 6.3) the tool checks an empty nat batch with --test, which
// commits nothing; for it iptables-nft sends a batch the kernel aborts,
// and an aborted batch waits an RCU grace period holding nf_tables'
// commit lock: 15 ms of `iptables-restore --test` here, STATUS 18 ms.
func (b *Backend) Ready(*plan.Plan) error {
	if s, err := b.Kernel.Chains(Table, []string{TopLevelDNATChain}, false); err == nil && len(s) == 1 {
		return nil
	}
	if err := b.Kernel.Writable(); !errors.Is(err, nfnl.ErrNoProbe) {
		return err
	}
	return b.Kernel.Test([]byte("*" + Table + "\nCOMMIT\n"))
}
