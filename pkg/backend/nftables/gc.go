package nftables

import (
	"fmt"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// GC removes every attachment of network that no valid attachment owns:
// the chains named with the network's prefix whose name is not one of the
// valid attachments', with the map elements that still point at them.
// Other networks' chains have another prefix and stay. It reads the table
// once (GC is the one verb that must look at everything) and removes all
// stale attachments in one transaction.
func (b *Backend) GC(network string, valid []plan.Owner) error {
	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	s, err := b.Kernel.Table(b.Family, Table)
	if err != nil {
		return fmt.Errorf("read table: %w", err)
	}
	if s == nil {
		return nil
	}
	keep := map[string]bool{}
	for _, o := range valid {
		keep[ChainName(o)] = true
	}
	prefix := NetworkPrefix(network)
	stale := map[string]bool{}
	for name := range s.Chains {
		if strings.HasPrefix(name, prefix) && !keep[name] {
			stale[name] = true
		}
	}
	tx := newTx(b.Family)
	removeChains(tx, s, stale)
	if tx.Len() == 0 {
		return nil
	}
	if err := b.Kernel.Apply(tx); err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	return nil
}

// removeChains deletes the chains of set and the elements that point at
// them, in name order.
func removeChains(tx *Tx, s *State, set map[string]bool) {
	for _, id := range sortedIDs(s.Holders) {
		if set[s.Holders[id]] {
			if k, ok := keyFromID(id); ok {
				tx.add(opDelete, elemObj{key: k})
			}
		}
	}
	for _, name := range sortedChains(s) {
		if set[name] {
			tx.add(opFlush, chainObj{name: name})
			tx.add(opDelete, chainObj{name: name})
		}
	}
}

// Ready reports whether the backend can serve ADD of p's kind: the kernel
// takes nf_tables messages from us and accepts the table — a batch it
// checks and aborts, so nothing changes — and, when p has conditions
// (nft syntax), nft is there to compile them.
func (b *Backend) Ready(p *plan.Plan) error {
	if len(p.Conditions) > 0 {
		if err := nftPresent(); err != nil {
			return err
		}
	}
	tx := newTx(b.Family)
	tx.add(opAdd, tableObj{tableComment})
	if err := b.Kernel.Validate(tx); err != nil {
		return err
	}
	return nil
}
