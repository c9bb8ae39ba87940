package iptables

import (
	"net"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt/xttest"
)

// traceMemory is m's trace of p (xttest.Memory.Trace) in plan's terms:
// the attachment's chain that translated it, where to, masqueraded or
// not. A trace the tracer cannot follow panics: the tests trace only
// what this package writes.
func traceMemory(m *xttest.Memory, p plan.Packet, local func(net.IP) bool) plan.Verdict {
	v, err := m.Trace(p, local)
	if err != nil {
		panic(err)
	}
	if v.DNAT == "" {
		return plan.Verdict{}
	}
	out := plan.Verdict{DNAT: v.DNAT, Masquerade: v.Masquerade}
	for _, c := range v.Chains {
		if strings.HasPrefix(c, dnChain) {
			out.Chain = c
			break
		}
	}
	return out
}
