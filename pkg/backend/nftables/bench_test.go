package nftables

import (
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// spread is a request of n TCP mappings no two of which make a run (the
// bench's "spread" shape): host ports 20000, 20002, … to port 80.
func spread(n int) func(*plan.Request) {
	return func(r *plan.Request) {
		r.Mappings = plan.Mappings{}
		for i := range n {
			r.Mappings.Add(plan.Mapping{Protocol: plan.TCP, HostPort: 20000 + 2*i, ContainerPort: 80})
		}
	}
}

// BenchmarkSpreadAddMessages: the fast ADD of 5000 spread mappings, from
// the plan to the netlink messages the kernel is sent.
func BenchmarkSpreadAddMessages(b *testing.B) {
	p := build(plan.IPv4, spread(5000))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := layoutOf(p).create().Messages(); err != nil {
			b.Fatal(err)
		}
	}
}
