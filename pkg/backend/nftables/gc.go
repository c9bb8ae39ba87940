package nftables

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
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
	prefix := networkPrefix(network)
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
func removeChains(tx *nft.Tx, s *State, set map[string]bool) {
	for _, k := range slices.SortedFunc(maps.Keys(s.Elements), compareKeys) {
		if set[s.Elements[k].Chain] {
			tx.Delete(Element{Key: k})
		}
	}
	for _, h := range s.Hairpins {
		if set[h.Chain] {
			tx.Delete(hairpinObj{h})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Chains)) {
		if set[name] {
			dropClaims(tx, name, s.Chains[name])
			tx.Flush(&nft.Chain{Name: name})
			tx.Delete(&nft.Chain{Name: name})
		}
	}
}

// Ready reports whether the backend can serve ADD of p's kind: nf_tables
// takes changes from us, and, when p has conditions (nft syntax), nft is
// there to compile them. Where the skeleton's dispatch chain can be read,
// an ADD wrote it in this family and the read was taken (nf_tables
// answers only CAP_NET_ADMIN): that is the answer. Otherwise (a fresh
// node, after a flush) the kernel is asked with a batch that commits
// nothing (Kernel.Writable); only a kernel before Linux 6.3 checks a
// batch that adds the table and aborts it, which waits an RCU grace
// period holding nf_tables' commit lock (~10 ms here, every other writer
// of the node waiting), while runtimes ask for STATUS every few seconds.
func (b *Backend) Ready(p *plan.Plan) error {
	if len(p.Conditions) > 0 {
		if err := nftPresent(); err != nil {
			return err
		}
	}
	if st, err := b.Kernel.Read(b.Family, Query{Probe: []string{DispatchChain}}); err == nil && len(st.Missing) == 0 {
		return nil
	}
	if err := b.Kernel.Writable(b.Family); !errors.Is(err, nfnl.ErrNoProbe) {
		return err
	}
	tx := newTx(b.Family)
	tx.Add(&nft.Table{Comment: tableComment})
	return b.Kernel.Validate(tx)
}

// nftPresent says why rules holding conditions cannot be written, or nil.
func nftPresent() error {
	if err := nft.Installed(); err != nil {
		return fmt.Errorf("conditionsV4/V6 are nft syntax, compiled by nft: %w", err)
	}
	return nil
}
