package nftables

import (
	"fmt"
	"net"
	"testing"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

// kernelTrace is nfttest's trace of p, which evaluates the rules'
// expressions, in plan's terms.
func kernelTrace(t *testing.T, m *Memory, f plan.Family, p plan.Packet) plan.Verdict {
	t.Helper()
	v, err := m.nf.Trace(nfttest.Packet{Family: nft.Family(f), Proto: string(p.Protocol), Src: p.Src, Dst: p.Dst, Dport: p.Dport, Output: p.FromHost}, fixture.IsLocal)
	if err != nil {
		t.Fatal(err)
	}
	return plan.Verdict{DNAT: v.DNAT, Masquerade: v.Masquerade}
}

// The kernel's tracer, which runs the expressions as written, and the
// layout's, which walks what a read of the table tells, agree on every
// trace of the fixtures' attachment, in each shape an attachment takes:
// flat, a chain (conditions), a chain with a DNAT map (8 mappings and
// more), a range; and after a newer attachment took a port.
func TestKernelTraceAgreesWithTheLayouts(t *testing.T) {
	many := func(r *plan.Request) {
		for i := range 10 {
			r.Mappings.Add(plan.Mapping{HostPort: 7000 + 2*i, ContainerPort: 70 + i, Protocol: plan.TCP})
		}
	}
	for _, tc := range []struct {
		name string
		mod  func(*plan.Request)
	}{
		{"flat", nil},
		{"a chain", func(r *plan.Request) { r.ConditionsV4 = []string{"meta iifname != \"lo\""} }},
		{"a chain with a DNAT map", func(r *plan.Request) {
			r.ConditionsV4 = []string{"meta iifname != \"lo\""}
			many(r)
		}},
		{"ranges", fixture.Ranges},
		{"ranges in a chain", func(r *plan.Request) {
			fixture.Ranges(r)
			r.ConditionsV4 = []string{"meta iifname != \"lo\""}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, m := memBackend()
			p := fixture.TestPlan(plan.IPv4, tc.mod)
			newer := fixture.Attachment("newer", "192.0.2.3/24", 8443)
			for _, a := range []*plan.Plan{p, newer} {
				if err := b.Apply(a); err != nil {
					t.Fatal(err)
				}
			}
			packets := []plan.Packet{}
			for _, tr := range fixture.Traces {
				packets = append(packets, tr.Packet)
			}
			for _, port := range []int{7000, 7001, 7018, 7020, 7070, 8000, 8005, 8010, 8011, 9999, 10000, 10500, 10999, 11000} {
				packets = append(packets, plan.Packet{Protocol: plan.TCP, Src: fixture.Remote, Dst: fixture.HostIP, Dport: port})
			}
			for _, port := range []int{4999, 5000, 5002, 5003} {
				packets = append(packets, plan.Packet{Protocol: plan.UDP, Src: fixture.Remote, Dst: fixture.HostIP, Dport: port},
					plan.Packet{Protocol: plan.UDP, Src: fixture.Remote, Dst: net.ParseIP("198.51.100.1").To4(), Dport: port})
			}
			for _, pk := range packets {
				want := trace(m, pk.Protocol, pk.Src, pk.Dst, pk.Dport, pk.FromHost)
				want.Chain = ""
				if got := kernelTrace(t, m, plan.IPv4, pk); got != want {
					t.Errorf("%s: the kernel's tracer %+v, the layout's %+v", fmt.Sprint(pk), got, want)
				}
			}
		})
	}
}
