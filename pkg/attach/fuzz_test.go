package attach

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/utils"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// FuzzParseConfig: no input makes Parse panic, and whatever it
// accepts is valid.
func FuzzParseConfig(f *testing.F) {
	for _, seed := range []string{
		`{"cniVersion":"1.0.0","name":"n","type":"portmap"}`,
		`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":8080,"protocol":"UDP","hostIP":"::"}]}}`,
		`{"name":"n","markMasqBit":31,"conditionsV4":["!","-d","192.0.2.0/24"],"backend":"iptables"}`,
		`{"name":"n","backend":"nftables","conditionsV6":["ip6 saddr != 2001:db8::/32"],"hostPortConflict":"reject"}`,
		`{"name":"n","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"192.0.2.2/24"}]}}`,
		`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":"80"}]}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		c, err := Parse(stdin, "eth0", backend.IPTables)
		if err != nil {
			return
		}
		for m := range c.Request.Mappings.All() {
			if m.HostPort < 1 || m.HostPort > 65535 || m.ContainerPort < 1 || m.ContainerPort > 65535 {
				t.Fatalf("accepted port out of range: %+v", m)
			}
			if _, ok := plan.ParseProtocol(string(m.Protocol)); !ok {
				t.Fatalf("accepted protocol %q", m.Protocol)
			}
		}
		if b := c.Request.Masquerade.MarkBit; b < 0 || b > 31 {
			t.Fatalf("accepted mark bit %d", b)
		}
	})
}

// FuzzRender: whatever configuration is accepted renders into an
// iptables-restore payload and an nft script that hold exactly the
// intended rules — a condition, name or address can neither add a line
// (another rule or command) nor change a rule's tokens.
func FuzzRender(f *testing.F) {
	f.Add("-d", "192.0.2.0/24", "net1", "c1", uint16(8080), "", "tcp", false)
	f.Add("!", "-s 1.2.3.4", "n", "id", uint16(53), "198.51.100.1", "udp", false)
	f.Add("ip saddr", "192.0.2.0/24", "n", "id", uint16(1), "2001:db8::1", "sctp", true)
	f.Add("-m", "comment --comment \"x\"\n-A INPUT -j ACCEPT", "n", "c", uint16(80), "", "tcp", false)
	f.Add("ip daddr 1.2.3.4", "; flush ruleset", "n", "c", uint16(80), "", "tcp", true)
	f.Fuzz(func(t *testing.T, cond1, cond2, network, id string, port uint16, hostIP, proto string, nft bool) {
		be := backend.IPTables
		if nft {
			be = backend.NFTables
		}
		conf := map[string]any{
			"cniVersion": "1.0.0", "name": network, "type": "portmap", "backend": be,
			"conditionsV4": []string{cond1, cond2},
			"runtimeConfig": map[string]any{"portMappings": []map[string]any{
				{"hostPort": port, "containerPort": 80, "protocol": proto, "hostIP": hostIP},
			}},
		}
		stdin, err := json.Marshal(conf)
		if err != nil {
			return
		}
		c, err := Parse(stdin, "eth0", backend.IPTables)
		if err != nil {
			return
		}
		if utils.ValidateContainerID(id) != nil {
			return // skel refuses it before the plugin runs
		}
		c.Request.Owner = plan.Owner{Network: network, ContainerID: id, IfName: "eth0"}
		_, n, _ := net.ParseCIDR("192.0.2.2/24")
		n.IP = net.ParseIP("192.0.2.2").To4()
		p := plan.Build(c.Request, plan.IPv4, n)
		if p.Empty() {
			return
		}
		if nft {
			script, commands := nftables.AddScript(p)
			lines := strings.Split(strings.TrimSuffix(script, "\n"), "\n")
			if len(lines) != commands {
				t.Fatalf("nft script has %d lines for %d commands:\n%s", len(lines), commands, script)
			}
			for _, l := range lines {
				if strings.Count(l, ";") != strings.Count(l, "{ comment") && !strings.Contains(l, " ; }") {
					t.Fatalf("a ';' splits a command:\n%s", l)
				}
			}
			return
		}
		checkIPTables(t, p, iptables.AddScript(p))
	})
}

// checkIPTables parses the payload back as iptables-restore does and
// compares it with the rules the plan says.
func checkIPTables(t *testing.T, p *plan.Plan, script string) {
	t.Helper()
	var want [][]string
	for _, r := range iptables.GuardRules(p) {
		want = append(want, append([]string{"-C", r.Chain}, r.Args()...))
	}
	if c, ok := iptables.Marker(p); ok {
		want = append(want, []string{"-F", c.Name})
	}
	want = append(want, []string{"-N", iptables.ChainName(p.Owner)})
	for _, r := range iptables.ChainRules(p) {
		want = append(want, append([]string{"-A", r.Chain}, r.Args()...))
	}
	entries := iptables.EntryRules(p)
	for i := len(entries) - 1; i >= 0; i-- {
		want = append(want, append([]string{"-I", entries[i].Chain, "1"}, entries[i].Args()...))
	}
	var got [][]string
	for _, l := range strings.Split(script, "\n") {
		if l == "" || l == "COMMIT" || strings.HasPrefix(l, "*") {
			continue
		}
		got = append(got, restoreTokens(l))
	}
	if len(got) != len(want) {
		t.Fatalf("payload has %d commands, want %d:\n%s", len(got), len(want), script)
	}
	for i := range want {
		if strings.Join(got[i], "\x00") != strings.Join(want[i], "\x00") {
			t.Fatalf("command %d parses as %q, want %q:\n%s", i, got[i], want[i], script)
		}
	}
}

// restoreTokens splits a line as iptables-restore does: blanks separate
// tokens, double quotes group, and inside quotes a backslash takes the
// next character as it is.
func restoreTokens(line string) []string {
	var out []string
	var cur strings.Builder
	inQuote, escaped, have := false, false, false
	for _, r := range line {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case inQuote && r == '\\':
			escaped = true
		case r == '"':
			inQuote = !inQuote
			have = true
		case !inQuote && (r == ' ' || r == '\t'):
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}

// FuzzMappingsJSON: the hand decoder of portMappings gives exactly what
// encoding/json gives whenever it takes an input (it may refuse more:
// Parse then takes the slow path).
func FuzzMappingsJSON(f *testing.F) {
	for _, seed := range append(mappingsJSONCases, shapeCases...) {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		diffMappingsJSON(t, b)
	})
}
