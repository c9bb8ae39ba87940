package nftables

import (
	"errors"
	"fmt"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// GC removes the chains of network (named with its prefix) that no valid
// attachment owns, with the elements that point at them: one read of the
// table, one transaction.
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

// Ready reports whether the backend can serve ADD of p's kind: nf_tables
// takes changes from us, and nft is there for conditions. A dispatch
// chain we can read answers it (nf_tables answers only CAP_NET_ADMIN);
// else a batch that commits nothing (Kernel.Writable); only before Linux
// 6.3 a batch that adds the table and aborts, which holds nf_tables'
// commit lock for an RCU grace period (~10 ms), while runtimes ask for
// STATUS every few seconds.
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
