package fakehost

import (
	"io"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// NFTablesInMemory makes h's nftables backend the real one over an
// nf_tables in memory, both families in one, and returns it: the
// plugin's verbs and the agent's passes then write and read rules as on
// a node, and a test asserts on what a read of it shows. The other
// backends and the layers stay recording fakes.
func NFTablesInMemory(h *host.Host) *nfttest.Kernel {
	k := nfttest.New()
	for i, kind := range h.Kinds {
		if kind.Name == backend.NFTables {
			h.Kinds[i].Open = func(f plan.Family, log io.Writer) (backend.Backend, error) {
				return nftables.NewOn(f, log, k), nil
			}
		}
	}
	return k
}
