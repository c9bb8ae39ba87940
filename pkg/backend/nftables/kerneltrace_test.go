package nftables

import (
	"fmt"
	"net"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

// Every shape an attachment takes — flat, a chain (conditions), a chain
// with a DNAT map (8 mappings and more), ranges, ranges in a chain —
// forwards (and masquerades) what its mappings say, traced through the expressions the
// in-memory kernel holds; a newer attachment that took port 8443 keeps it.
func TestTracesInEveryShape(t *testing.T) {
	cond := func(r *plan.Request) { r.ConditionsV4 = []string{"meta iifname != \"lo\""} }
	many := func(r *plan.Request) {
		cond(r)
		for i := range 10 {
			r.Mappings.Add(plan.Mapping{HostPort: 7000 + 2*i, ContainerPort: 70 + i, Protocol: plan.TCP})
		}
	}
	ranges := func(r *plan.Request) { fixture.Ranges(r); cond(r) }
	tcp := func(port int) plan.Packet {
		return plan.Packet{Protocol: plan.TCP, Src: fixture.Remote, Dst: fixture.HostIP, Dport: port}
	}
	udp := func(dst string, port int) plan.Packet {
		return plan.Packet{Protocol: plan.UDP, Src: fixture.Remote, Dst: net.ParseIP(dst).To4(), Dport: port}
	}
	type want struct {
		p    plan.Packet
		dnat string
		masq bool
	}
	var traces []want // the fixture's, with 8443 the newer attachment's
	for _, tr := range fixture.Traces {
		w := tr.DNAT
		if tr.Packet.Dport == 8443 && w != "" {
			w = "192.0.2.3:80"
		}
		traces = append(traces, want{tr.Packet, w, tr.Masquerade})
	}
	rangeTraces := []want{
		{tcp(10000), "192.0.2.2:10000", false}, {tcp(10500), "192.0.2.2:10500", false}, {tcp(10999), "192.0.2.2:10999", false}, {tcp(11000), "", false},
		{tcp(7070), "192.0.2.2:80", false}, {tcp(8000), "192.0.2.2:9000", false}, {tcp(8010), "192.0.2.2:9010", false}, {tcp(8011), "", false},
		{tcp(8443), "192.0.2.3:80", false}, {tcp(8080), "", false}, {tcp(9999), "", false},
		{udp("198.51.100.1", 5000), "192.0.2.2:5000", false}, {udp("198.51.100.1", 5002), "192.0.2.2:5002", false},
		{udp("198.51.100.1", 5003), "", false}, {udp("198.51.100.1", 4999), "", false},
		// a container of the subnet to a range port: hairpin, masqueraded
		{plan.Packet{Protocol: plan.TCP, Src: net.ParseIP("192.0.2.77").To4(), Dst: fixture.HostIP, Dport: 10001}, "192.0.2.2:10001", true},
	}
	for _, tc := range []struct {
		name   string
		mod    func(*plan.Request)
		traces []want
	}{
		{"flat", nil, traces},
		{"a chain", cond, traces},
		{"a chain with a DNAT map", many, append([]want{{tcp(7000), "192.0.2.2:70", false}, {tcp(7018), "192.0.2.2:79", false}, {tcp(7001), "", false}, {tcp(7020), "", false}}, traces...)},
		{"ranges", fixture.Ranges, rangeTraces},
		{"ranges in a chain", ranges, rangeTraces},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, m := memBackend()
			newer := fixture.Attachment("newer", "192.0.2.3/24", 8443)
			for _, a := range []*plan.Plan{fixture.TestPlan(plan.IPv4, tc.mod), newer} {
				if err := b.Apply(a); err != nil {
					t.Fatal(err)
				}
			}
			for _, w := range tc.traces {
				if got := trace(t, m, w.p.Protocol, w.p.Src, w.p.Dst, w.p.Dport, w.p.FromHost); got.DNAT != w.dnat || got.Masquerade != w.masq {
					t.Errorf("%s: %+v, want DNAT %q, masquerade %v", fmt.Sprint(w.p), got, w.dnat, w.masq)
				}
			}
		})
	}
}
