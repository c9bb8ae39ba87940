package iptables

import (
	"errors"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

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
