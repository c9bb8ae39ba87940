package nftables

import (
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// GC removes every attachment of network that no valid attachment owns:
// the chains named with the network's prefix whose name is not one of the
// valid attachments', with the map elements that still point at them.
// Other networks' chains have another prefix and stay. It lists the table
// once (GC is the one verb that must look at everything) and removes all
// stale attachments in one transaction.
func (b *Backend) GC(network string, valid []plan.Owner) error {
	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	out, err := b.Kernel.Run(fmt.Sprintf("list table %s %s\n", nftFamily(b.Family), Table))
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: list table: %w", b.Family, err)
	}
	keep := map[string]bool{}
	for _, o := range valid {
		keep[ChainName(o)] = true
	}
	prefix := NetworkPrefix(network)
	chains := splitChains(out)
	holders := parseMaps(out)
	tx := newTx(b.Family)
	for name := range chains {
		if !strings.HasPrefix(name, prefix) || keep[name] {
			continue
		}
		for mk, h := range holders {
			if h != name {
				continue
			}
			m, key, _ := strings.Cut(mk, " ")
			if k, ok := parseKey(key); ok {
				tx.Delete(&knftables.Element{Map: m, Key: k.Fields()})
			}
		}
		tx.Flush(&knftables.Chain{Name: name})
		tx.Delete(&knftables.Chain{Name: name})
	}
	if tx.NumOperations() == 0 {
		return nil
	}
	if err := b.run(tx); err != nil {
		return fmt.Errorf("%s: gc: %w", b.Family, err)
	}
	return nil
}

// Ready reports whether the backend can serve ADD: nft runs, may change
// rules, and the kernel accepts the table (checked with nft --check,
// which commits nothing).
func (b *Backend) Ready() error {
	tx := newTx(b.Family)
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(tableComment)})
	if err := b.Kernel.Check(tx.String()); err != nil {
		return fmt.Errorf("%s: %w", b.Family, err)
	}
	return nil
}
