package nftables

// Upstream portmap's nftables table (cni_hostport): DEL, GC and sync
// remove the rules it wrote for a container, found by their comment.

import (
	"fmt"
	"maps"
	"slices"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// removeUpstreamLocked cleans the upstream plugin's table of the
// container's rules, taking the lock only when that table exists.
func (b *Backend) removeUpstreamLocked(o plan.Owner) error {
	up, err := b.Kernel.Table(b.Family, upstreamTable)
	if err != nil {
		return fmt.Errorf("read %s: %w", upstreamTable, err)
	}
	if up == nil {
		return nil
	}
	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	return b.removeUpstream(o)
}

// removeUpstream deletes the rules the upstream plugin's nftables backend
// made for the container in its cni_hostport table (commented with the
// container ID), so that a node can move from it to us.
func (b *Backend) removeUpstream(o plan.Owner) error {
	up, err := b.Kernel.Table(b.Family, upstreamTable)
	if err != nil {
		return fmt.Errorf("read %s: %w", upstreamTable, err)
	}
	tx := upstreamTx(b.Family, up, map[string]bool{o.ContainerID: true})
	if tx.Len() == 0 {
		return nil
	}
	if err := b.Kernel.Apply(tx); err != nil {
		return fmt.Errorf("remove upstream rules of %q: %w", o.ContainerID, err)
	}
	return nil
}

// upstreamTx deletes, by handle, the cni_hostport rules whose comment is
// one of ids.
func upstreamTx(f plan.Family, up *State, ids map[string]bool) *nft.Tx {
	tx := nft.NewTx(nft.Family(f), upstreamTable)
	if up == nil {
		return tx
	}
	for _, name := range slices.Sorted(maps.Keys(up.Chains)) {
		for _, r := range up.Chains[name].Rules {
			if ids[r.Comment] {
				tx.Delete(&nft.Rule{Chain: name, Handle: r.Handle})
			}
		}
	}
	return tx
}

// upstreamRules counts the upstream plugin's cni_hostport rules by the
// container ID of their comment.
func upstreamRules(up *State) map[string]int {
	rules := map[string]int{}
	if up == nil {
		return rules
	}
	for _, c := range up.Chains {
		for _, r := range c.Rules {
			if r.Comment != "" {
				rules[r.Comment]++
			}
		}
	}
	return rules
}
