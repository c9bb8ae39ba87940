package nettest

import (
	"flag"
	"net"
	"os"

	"github.com/portmap-dev/portmap/pkg/plan"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// GoldenTB is what Golden needs of a test.
type GoldenTB interface {
	Helper()
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
}

// Golden compares got with the golden file at path; `go test -update`
// rewrites the file first. One loop for every golden file of the tree.
func Golden(tb GoldenTB, path, got string) {
	tb.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			tb.Fatalf("%v", err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("read golden (run with -update to create): %v", err)
	}
	if got != string(want) {
		tb.Errorf("differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
	}
}

// The unit tests' IP plan, from the documentation ranges:
//
//	container      192.0.2.2/24, 2001:db8::2/64
//	host address   198.51.100.1 (a mapping restricted to it), 2001:db8::1
//	network "net1", container "c1", interface eth0, mark bit 13
var (
	Owner    = plan.Owner{Network: "net1", ContainerID: "c1", IfName: "eth0"}
	V4Net    = mustCIDR("192.0.2.2/24")
	V6Net    = mustCIDR("2001:db8::2/64")
	Mappings = []plan.Mapping{
		{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP},
		{HostPort: 8443, ContainerPort: 443, Protocol: plan.TCP},
		{HostIP: net.ParseIP("198.51.100.1").To4(), HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP},
		{HostIP: net.ParseIP("2001:db8::1"), HostPort: 8054, ContainerPort: 54, Protocol: plan.UDP},
		{HostPort: 9000, ContainerPort: 9000, Protocol: plan.SCTP},
	}
)

// TestPlan is the plan of the test IP plan's attachment in family f, after
// mod (when not nil) changed its request.
func TestPlan(f plan.Family, mod func(*plan.Request)) *plan.Plan {
	req := plan.Request{Owner: Owner, Mappings: Mappings, Masquerade: plan.Masquerade{Enabled: true, MarkBit: 13}}
	if mod != nil {
		mod(&req)
	}
	n := V4Net
	if f == plan.IPv6 {
		n = V6Net
	}
	return plan.Build(req, f, n)
}

func mustCIDR(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	if v4 := ip.To4(); v4 != nil {
		n.IP = v4
	}
	return n
}

// SyncPlans are the three attachments the backends' canned listings
// (testdata/sync-listing-v4.txt) were made from: a (8080/tcp and
// 198.51.100.1:8053/udp to aIP) and b (9090/tcp to 192.0.2.3, with the
// backend's spelling of "not to 10.1.0.0/16" as bCond) on net1, and o
// (7070/tcp to 192.0.2.4) on network "old". A test moves a by another aIP.
func SyncPlans(aIP string, bCond []string) (a, b, o *plan.Plan) {
	m := plan.Masquerade{Enabled: true, MarkBit: 13}
	ra := plan.Request{Owner: plan.Owner{Network: "net1", ContainerID: "a", IfName: "eth0"}, Masquerade: m,
		Mappings: []plan.Mapping{{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP},
			{HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP, HostIP: net.ParseIP("198.51.100.1").To4()}}}
	rb := plan.Request{Owner: plan.Owner{Network: "net1", ContainerID: "b", IfName: "eth0"}, Masquerade: m,
		Mappings:     []plan.Mapping{{HostPort: 9090, ContainerPort: 90, Protocol: plan.TCP}},
		ConditionsV4: bCond}
	ro := plan.Request{Owner: plan.Owner{Network: "old", ContainerID: "o", IfName: "eth0"}, Masquerade: m,
		Mappings: []plan.Mapping{{HostPort: 7070, ContainerPort: 70, Protocol: plan.TCP}}}
	return plan.Build(ra, plan.IPv4, mustCIDR(aIP+"/24")), plan.Build(rb, plan.IPv4, mustCIDR("192.0.2.3/24")),
		plan.Build(ro, plan.IPv4, mustCIDR("192.0.2.4/24"))
}
