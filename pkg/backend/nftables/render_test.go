package nftables

import (
	"flag"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// The test IP plan, from the documentation ranges:
//
//	container      192.0.2.2/24, 2001:db8::2/64
//	host address   198.51.100.1 (a mapping restricted to it)
//	network "net1", container "c1", interface eth0
var (
	owner = plan.Owner{Network: "net1", ContainerID: "c1", IfName: "eth0"}
	maps  = []plan.Mapping{
		{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP},
		{HostIP: net.ParseIP("198.51.100.1").To4(), HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP},
		{HostIP: net.ParseIP("2001:db8::1"), HostPort: 8054, ContainerPort: 54, Protocol: plan.UDP},
		{HostPort: 9000, ContainerPort: 9000, Protocol: plan.SCTP},
	}
)

func build(f plan.Family, mod func(*plan.Request)) *plan.Plan {
	req := plan.Request{Owner: owner, Mappings: maps, Masquerade: plan.Masquerade{Enabled: true, MarkBit: 13}}
	if mod != nil {
		mod(&req)
	}
	cidr := "192.0.2.2/24"
	if f == plan.IPv6 {
		cidr = "2001:db8::2/64"
	}
	ip, n, _ := net.ParseCIDR(cidr)
	n.IP = ip
	if v4 := ip.To4(); v4 != nil {
		n.IP = v4
	}
	return plan.Build(req, f, n)
}

// skeletonTx is what the slow path writes before an attachment.
func skeletonTx(p *plan.Plan) string {
	tx := newTx(p.Family)
	addSkeleton(tx, p)
	return tx.String()
}

// addTx is the fast-path ADD transaction, as Apply sends it.
func addTx(p *plan.Plan) string { return fastAddTx(p).String() }

func delTx(p *plan.Plan) string { return fastDelTx(p).String() }

func TestGoldenTransactions(t *testing.T) {
	tests := []struct{ name, got string }{
		{"skeleton-v4", skeletonTx(build(plan.IPv4, nil))},
		{"skeleton-v6-snat-off", skeletonTx(build(plan.IPv6, func(r *plan.Request) { r.Masquerade.Enabled = false }))},
		{"add-v4", addTx(build(plan.IPv4, nil))},
		{"add-v6", addTx(build(plan.IPv6, nil))},
		{"add-snat-off", addTx(build(plan.IPv4, func(r *plan.Request) { r.Masquerade.Enabled = false }))},
		{"add-masqall-bit5-conditions", addTx(build(plan.IPv4, func(r *plan.Request) {
			r.Masquerade.All, r.Masquerade.MarkBit = true, 5
			r.ConditionsV4 = []string{"ip saddr != 203.0.113.0/24"}
		}))},
		{"del-v4", delTx(build(plan.IPv4, nil))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join("testdata", tt.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(tt.got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run with -update to create): %v", err)
			}
			if tt.got != string(want) {
				t.Errorf("transaction differs from %s:\n--- got\n%s--- want\n%s", path, tt.got, want)
			}
		})
	}
}

func TestNames(t *testing.T) {
	// Kernel-kept names: a change strands existing state on upgrade.
	if got, want := ChainName(owner), "dn-6c270ef2f251d571-15e80ba988d4bd27"; got != want {
		t.Errorf("ChainName = %q, want %q", got, want)
	}
	other := plan.Owner{Network: "net1", ContainerID: "c1", IfName: "eth1"}
	if ChainName(other) == ChainName(owner) {
		t.Error("two interfaces of one container share a chain")
	}
	if got := NetworkPrefix("net1"); got != ChainName(owner)[:len(got)] {
		t.Errorf("NetworkPrefix %q does not start the chain name", got)
	}
}

func TestKeysRoundTrip(t *testing.T) {
	for _, k := range Keys(build(plan.IPv4, nil)) {
		back, ok := parseKey(k.String())
		if !ok || back.String() != k.String() || back.Map() != k.Map() {
			t.Errorf("parseKey(%q) = %v, %v", k, back, ok)
		}
	}
	for _, bad := range []string{"", "tcp", "icmp . 80", "tcp . x", "nope . tcp . 80"} {
		if k, ok := parseKey(bad); ok {
			t.Errorf("parseKey(%q) accepted: %v", bad, k)
		}
	}
}

func TestParseMaps(t *testing.T) {
	out := `table ip cni_portmap {
	map hostports { # handle 1
		type inet_proto . inet_service : verdict
		elements = { tcp . 8080 : goto dn-a-1,
			     udp . 53 : goto dn-b-2 }
	}
	map hostip_hostports { # handle 2
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 198.51.100.1 . udp . 8053 : goto dn-a-1 }
	}
}
table ip kube-proxy {
	map service-ips {
		elements = { 10.0.0.1 . tcp . 443 : goto svc-x }
	}
}
`
	got := parseMaps(out)
	want := map[string]string{
		"hostports tcp . 8080":                       "dn-a-1",
		"hostports udp . 53":                         "dn-b-2",
		"hostip_hostports 198.51.100.1 . udp . 8053": "dn-a-1",
	}
	if len(got) != len(want) {
		t.Errorf("parseMaps = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("parseMaps[%q] = %q, want %q", k, got[k], v)
		}
	}
}
