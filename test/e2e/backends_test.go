package e2e

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

// backend is what the scenarios need to know of one backend: how to select
// it, how to read its state, and how to break it by hand.
type backend struct {
	name string
	// ruleset is everything the backend keeps, both families, for diffs.
	ruleset func(t *testing.T) string
	// chain is the name of the attachment's own chain.
	chain func(o plan.Owner) string
	// deleteDNAT removes the DNAT rule of hostPort from the attachment's
	// chain (on nftables, a flat attachment's DNAT element or, where
	// another attachment took the port over, its claim rules).
	deleteDNAT func(t *testing.T, o plan.Owner, c *nettest.Container, hostPort int)
	// breakShared removes a shared jump, and returns how to put it back.
	breakShared func(t *testing.T) (missing string, repair func())
	// flush is the firewall flush an operator does (a reload, a cleanup).
	flush [][]string
}

// flushFirewall runs the backend's flush.
func (b backend) flushFirewall(t *testing.T) {
	t.Helper()
	for _, c := range b.flush {
		nettest.Run(t, c[0], c[1:]...)
	}
}

var backends = []backend{
	{
		name:  "iptables",
		flush: [][]string{{"iptables", "-t", "nat", "-F"}, {"ip6tables", "-t", "nat", "-F"}},
		ruleset: func(t *testing.T) string {
			return nettest.Save(t, 4) + "\n" + nettest.Save(t, 6)
		},
		chain: iptables.ChainName,
		deleteDNAT: func(t *testing.T, o plan.Owner, c *nettest.Container, hostPort int) {
			nettest.Run(t, "iptables", "-t", "nat", "-D", iptables.ChainName(o), "-p", "tcp", "--dport", fmt.Sprint(hostPort),
				"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", c.IP(4), srvPort))
		},
		breakShared: func(t *testing.T) (string, func()) {
			jump := []string{"OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-j", iptables.TopLevelDNATChain}
			nettest.Run(t, "iptables", append([]string{"-t", "nat", "-D"}, jump...)...)
			return "OUTPUT", func() { nettest.Run(t, "iptables", append([]string{"-t", "nat", "-A"}, jump...)...) }
		},
	},
	{
		name:  "nftables",
		flush: [][]string{{"nft", "flush", "ruleset"}},
		ruleset: func(t *testing.T) string {
			var out []string
			for _, fam := range []string{"ip", "ip6"} {
				b, err := exec.Command("nft", "list", "table", fam, nftables.Table).CombinedOutput()
				if err != nil && !strings.Contains(string(b), "No such file") {
					t.Fatalf("nft list table %s: %v\n%s", fam, err, b)
				}
				out = append(out, string(b))
			}
			return strings.Join(out, "\n")
		},
		chain: nftables.ChainName,
		deleteDNAT: func(t *testing.T, o plan.Owner, c *nettest.Container, hostPort int) {
			chain := nftables.ChainName(o)
			out := nettest.Run(t, "nft", "-a", "list", "chain", "ip", nftables.Table, chain)
			if m := regexp.MustCompile(fmt.Sprintf(`comment "hostport tcp \. %d" # handle (\d+)`, hostPort)).FindStringSubmatch(out); m != nil {
				nettest.Run(t, "nft", "delete", "rule", "ip", nftables.Table, chain, "handle", m[1])
				return
			}
			// a flat attachment: its DNAT is its element of the DNAT map
			// or, where another took the port over, the rule recording
			// the key
			elems := nettest.Run(t, "nft", "list", "map", "ip", nftables.Table, nftables.HostDNATMap)
			if strings.Contains(elems, fmt.Sprintf("tcp . %d comment \"%s ", hostPort, chain)) {
				nettest.Run(t, "nft", "delete", "element", "ip", nftables.Table, nftables.HostDNATMap, fmt.Sprintf("{ tcp . %d }", hostPort))
				return
			}
			m := regexp.MustCompile(fmt.Sprintf(`comment "record tcp \. %d" # handle (\d+)`, hostPort)).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("chain %s neither forwards nor records tcp . %d:\n%s", chain, hostPort, out)
			}
			nettest.Run(t, "nft", "delete", "rule", "ip", nftables.Table, chain, "handle", m[1])
		},
		breakShared: func(t *testing.T) (string, func()) {
			nettest.Run(t, "nft", "flush", "chain", "ip", nftables.Table, "output")
			return "output", func() {
				nettest.Run(t, "nft", "add", "rule", "ip", nftables.Table, "output", "fib", "daddr", "type", "local", "jump", nftables.DispatchChain)
			}
		},
	},
}

// forBackends runs f as a subtest per backend with the backend's config
// keys.
func forBackends(t *testing.T, f func(t *testing.T, b backend, extra map[string]string)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			f(t, b, map[string]string{"backend": fmt.Sprintf("%q", b.name)})
		})
	}
}
