package iptables

import (
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
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
	v4Net = mustCIDR("192.0.2.2/24")
	v6Net = mustCIDR("2001:db8::2/64")
	maps  = []plan.Mapping{
		{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP},
		{HostPort: 8443, ContainerPort: 443, Protocol: plan.TCP},
		{HostIP: net.ParseIP("198.51.100.1").To4(), HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP},
		{HostIP: net.ParseIP("2001:db8::1"), HostPort: 8054, ContainerPort: 54, Protocol: plan.UDP},
		{HostPort: 9000, ContainerPort: 9000, Protocol: plan.SCTP},
	}
	masq = plan.Masquerade{Enabled: true, MarkBit: 13}
)

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

func build(f plan.Family, mod func(*plan.Request)) *plan.Plan {
	req := plan.Request{Owner: owner, Mappings: maps, Masquerade: masq}
	if mod != nil {
		mod(&req)
	}
	n := v4Net
	if f == plan.IPv6 {
		n = v6Net
	}
	return plan.Build(req, f, n)
}

func manyPorts(r *plan.Request) {
	r.Mappings = nil
	for p := 10001; p <= 10017; p++ {
		r.Mappings = append(r.Mappings, plan.Mapping{HostPort: p, ContainerPort: 80, Protocol: plan.TCP})
	}
}

func TestGoldenPayloads(t *testing.T) {
	ref := `-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net1\" id: \"c1\"" -m multiport --dports 7070 -j ` + ChainName(owner)
	tests := []struct {
		name string
		pl   *payload
	}{
		{"add-v4", addPayload(build(plan.IPv4, nil))},
		{"add-v6", addPayload(build(plan.IPv6, nil))},
		{"add-snat-off", addPayload(build(plan.IPv4, func(r *plan.Request) { r.Masquerade.Enabled = false }))},
		{"add-external-chain", addPayload(build(plan.IPv4, func(r *plan.Request) {
			r.Masquerade = plan.Masquerade{Enabled: true, ExternalSetMarkChain: "KUBE-MARK-MASQ"}
		}))},
		{"add-masqall-bit5", addPayload(build(plan.IPv4, func(r *plan.Request) { r.Masquerade.All, r.Masquerade.MarkBit = true, 5 }))},
		{"add-conditions", addPayload(build(plan.IPv4, func(r *plan.Request) {
			r.ConditionsV4 = []string{"!", "-s", "203.0.113.0/24", "-m", "comment", "--comment", "keep out"}
		}))},
		{"add-17-ports", addPayload(build(plan.IPv4, manyPorts))},
		{"replace-v4", replacePayload(build(plan.IPv4, nil), []string{ref})},
		{"del-fast-v4", delPayload(build(plan.IPv4, nil), EntryRules(build(plan.IPv4, nil)), nil)},
		{"del-refs", delPayload(build(plan.IPv4, func(r *plan.Request) { r.Mappings = nil }), nil, []string{ref})},
		{"check-v4", checkPayload(build(plan.IPv4, nil))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(tt.pl.bytes())
			path := filepath.Join("testdata", tt.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run with -update to create): %v", err)
			}
			if got != string(want) {
				t.Errorf("payload differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

func TestChainNameIsUpstreams(t *testing.T) {
	// Computed by the upstream plugin's genDnatChain("net1", "c1"); a change
	// here strands every existing rule on upgrade.
	if got, want := ChainName(owner), "CNI-DN-c2d892b58e87e28a12fe6"; got != want {
		t.Errorf("ChainName = %q, want %q", got, want)
	}
	if got, want := EntryComment(owner), `dnat name: "net1" id: "c1"`; got != want {
		t.Errorf("EntryComment = %q, want %q", got, want)
	}
	long := EntryComment(plan.Owner{Network: "n", ContainerID: strings.Repeat("a", 300)})
	if len(long) != maxComment || !strings.HasSuffix(long, "...") {
		t.Errorf("long comment has %d chars (%q...), want %d ending in ...", len(long), long[:20], maxComment)
	}
}

func TestQuoteArg(t *testing.T) {
	tests := []struct{ in, want string }{
		{"-d", "-d"},
		{"192.0.2.0/24", "192.0.2.0/24"},
		{"a b", `"a b"`},
		{"", `""`},
		{`dnat name: "n" id: "c"`, `"dnat name: \"n\" id: \"c\""`},
		{`back\slash`, `"back\\slash"`},
	}
	for _, tt := range tests {
		if got := quoteArg(tt.in); got != tt.want {
			t.Errorf("quoteArg(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestExplain(t *testing.T) {
	pl := checkPayload(build(plan.IPv4, nil))
	pl.bytes()
	tests := []struct{ out, want string }{
		{"iptables-restore: line 7 failed: Bad rule (does a matching rule exist in that chain?).", `rule "-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"`},
		{"iptables-restore: line 2 failed: Bad rule (does a matching rule exist in that chain?).", `rule "-A INPUT -j CNI-HOSTPORT-GUARD" (table filter)`},
		{"iptables-restore v1.8.9 (nf_tables): Chain 'X' does not exist\nError occurred at line: 9\n", "chain X"},
		{"Error occurred at line: 5\n", "table nat"},
		{"something else", ""},
		{"line 999 failed", ""},
	}
	for _, tt := range tests {
		if got := pl.explain(tt.out); got != tt.want {
			t.Errorf("explain(%q) = %q, want %q", tt.out, got, tt.want)
		}
	}
}
