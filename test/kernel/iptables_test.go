package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/test/nettest"
)

// counting wraps the real kernel seam and counts what the backend spawns
// and its native transactions (AddChain: no process).
type counting struct {
	xt.Kernel
	restores, lists, chainLists, ensures, natives int
}

func (c *counting) AddChain(marker, chain string, rules, entries []xt.Rule, jumps ...string) error {
	c.natives++
	return c.Kernel.AddChain(marker, chain, rules, entries, jumps...)
}

func (c *counting) ListChain(chain string) ([]string, error) {
	c.chainLists++
	return c.Kernel.ListChain(chain)
}

func (c *counting) Restore(p []byte) error { c.restores++; return c.Kernel.Restore(p) }
func (c *counting) ListTable() ([]string, error) {
	c.lists++
	return c.Kernel.ListTable()
}
func (c *counting) EnsureChain(ch xt.Chain) error {
	c.ensures++
	return c.Kernel.EnsureChain(ch)
}
func (c *counting) EnsureRule(r xt.Rule) error {
	c.ensures++
	return c.Kernel.EnsureRule(r)
}

func backend(t *testing.T, f plan.Family) (*iptables.Backend, *counting) {
	t.Helper()
	b, err := iptables.New(f)
	if err != nil {
		t.Fatal(err)
	}
	c := &counting{Kernel: b.Kernel}
	b.Kernel = c
	return b, c
}

func cidr(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

func mkPlan(net, id, ip string, ports ...int) *plan.Plan {
	req := plan.Request{
		Owner:      plan.Owner{Network: net, ContainerID: id, IfName: "eth0"},
		Masquerade: plan.Masquerade{Enabled: true, MarkBit: 13},
	}
	for _, p := range ports {
		req.Mappings.Add(plan.Mapping{HostPort: p, ContainerPort: 80, Protocol: plan.TCP})
	}
	n := cidr(ip)
	return plan.Build(req, plan.FamilyOf(n.IP), n)
}

func TestApplyCheckRemove(t *testing.T) {
	nettest.ResetNAT(t)
	for _, tt := range []struct {
		f  plan.Family
		ip string
	}{{plan.IPv4, "192.0.2.2/24"}, {plan.IPv6, "2001:db8::2/64"}} {
		t.Run(tt.f.String(), func(t *testing.T) {
			b, _ := backend(t, tt.f)
			p := mkPlan("net1", "c1", tt.ip, 8080, 8443)
			if err := b.Check(p); err == nil {
				t.Fatal("Check before Apply succeeded")
			}
			if err := b.Apply(p); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if err := b.Check(p); err != nil {
				t.Fatalf("Check: %v", err)
			}
			if err := b.Remove(p); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			err := b.Check(p)
			if err == nil || !strings.Contains(err.Error(), "missing chain "+iptables.ChainName(p.Owner)) {
				t.Errorf("Check after Remove: %v, want the missing chain named", err)
			}
			if err := b.Remove(p); err != nil {
				t.Errorf("second Remove: %v", err)
			}
			if rules := nettest.Save(t, int(tt.f)); strings.Contains(rules, "CNI-DN-") {
				t.Errorf("left after Remove:\n%s", rules)
			}
		})
	}
}

// TestReAddReplaces: a second ADD of the same attachment with another IP and
// other ports leaves no rule of the first behind.
func TestReAddReplaces(t *testing.T) {
	nettest.ResetNAT(t)
	b, _ := backend(t, plan.IPv4)
	if err := b.Apply(mkPlan("net1", "c1", "192.0.2.2/24", 8080, 8081)); err != nil {
		t.Fatal(err)
	}
	p2 := mkPlan("net1", "c1", "192.0.2.3/24", 9090)
	if err := b.Apply(p2); err != nil {
		t.Fatalf("re-ADD: %v", err)
	}
	rules := nettest.Save(t, 4)
	for _, stale := range []string{"192.0.2.2", "8080", "8081"} {
		if strings.Contains(rules, stale) {
			t.Errorf("stale %q survives re-ADD:\n%s", stale, rules)
		}
	}
	if n := strings.Count(rules, "-A CNI-HOSTPORT-DNAT "); n != 1 {
		t.Errorf("%d entry rules after re-ADD, want 1:\n%s", n, rules)
	}
	if err := b.Check(p2); err != nil {
		t.Errorf("Check: %v", err)
	}
}

// TestSameIPOwnership: ADD A with IP X, ADD B with IP X (A's IP was reused
// before A's DEL), DEL A: B's rules stay.
func TestSameIPOwnership(t *testing.T) {
	nettest.ResetNAT(t)
	b, _ := backend(t, plan.IPv4)
	a, bb := mkPlan("net1", "A", "192.0.2.9/24", 8080), mkPlan("net1", "B", "192.0.2.9/24", 8080)
	for _, p := range []*plan.Plan{a, bb} {
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Remove(a); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(bb); err != nil {
		t.Errorf("B after DEL A: %v", err)
	}
	if rules := nettest.Save(t, 4); strings.Contains(rules, iptables.ChainName(a.Owner)) {
		t.Errorf("A's chain survives:\n%s", rules)
	}
}

// TestSteadyStateIsNoProcess: once the shared chains exist, ADD of an
// attachment (iptables here is iptables-nft) is one nf_tables
// transaction, no process, and lists nothing; CHECK runs no process
// either (it reads over netlink the shared rules and the attachment's
// chain, whose rules it compares with what ADD writes: nothing that
// grows with the attachments), and neither does DEL: one nf_tables
// transaction over netlink — with 0 or 300 other attachments installed.
func TestSteadyStateIsNoProcess(t *testing.T) {
	nettest.ResetNAT(t)
	b, c := backend(t, plan.IPv4)
	if err := b.Apply(mkPlan("net1", "first", "192.0.2.2/24", 7000)); err != nil {
		t.Fatal(err)
	}
	measure := func(label string) {
		*c = counting{Kernel: c.Kernel}
		p := mkPlan("net1", "probe", "192.0.2.3/24", 8080, 8081)
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
		if c.natives != 1 || c.restores != 0 || c.lists != 0 || c.ensures != 0 {
			t.Errorf("%s: ADD ran %d native transactions, %d restores, %d listings, %d ensures; want 1, 0, 0, 0", label, c.natives, c.restores, c.lists, c.ensures)
		}
		*c = counting{Kernel: c.Kernel}
		if err := b.Check(p); err != nil {
			t.Fatalf("%s: CHECK: %v", label, err)
		}
		if c.restores != 0 || c.lists != 0 || c.chainLists != 0 || c.ensures != 0 {
			t.Errorf("%s: CHECK ran %d restores, %d table listings, %d chain listings, %d ensures; want none", label, c.restores, c.lists, c.chainLists, c.ensures)
		}
		*c = counting{Kernel: c.Kernel}
		if err := b.Remove(p); err != nil {
			t.Fatal(err)
		}
		if c.restores != 0 || c.lists != 0 || c.ensures != 0 {
			t.Errorf("%s: DEL ran %d restores, %d listings, %d ensures; want none", label, c.restores, c.lists, c.ensures)
		}
		if rules := nettest.Save(t, 4); strings.Contains(rules, iptables.ChainName(p.Owner)) {
			t.Errorf("%s: DEL left the attachment:\n%s", label, rules)
		}
	}
	measure("0 others")
	for i := range 300 {
		if err := b.Apply(mkPlan("net1", fmt.Sprintf("o%d", i), "192.0.2.4/24", 10000+i)); err != nil {
			t.Fatal(err)
		}
	}
	measure("300 others")
}

// TestFailedApplyLeavesNothing: a plan the kernel refuses (a jump to a
// missing external chain) changes nothing of the attachment.
func TestFailedApplyLeavesNothing(t *testing.T) {
	nettest.ResetNAT(t)
	b, _ := backend(t, plan.IPv4)
	p := mkPlan("net1", "bad", "192.0.2.2/24", 8080)
	p.Masquerade.ExternalSetMarkChain = "NO-SUCH-CHAIN"
	err := b.Apply(p)
	if err == nil || !strings.Contains(err.Error(), "NO-SUCH-CHAIN") {
		t.Fatalf("Apply: %v, want an error naming the missing chain", err)
	}
	if rules := nettest.Save(t, 4); strings.Contains(rules, iptables.ChainName(p.Owner)) {
		t.Errorf("failed Apply left the chain:\n%s", rules)
	}
}

// TestUpstreamLeftoversRemoved: rules the upstream plugin made for a
// container are removed by our DEL, with and without the mappings.
func TestUpstreamLeftoversRemoved(t *testing.T) {
	for _, withMappings := range []bool{true, false} {
		t.Run(fmt.Sprintf("mappings=%v", withMappings), func(t *testing.T) {
			nettest.ResetNAT(t)
			conf := nettest.PortmapConf("net1", "",
				[]nettest.Mapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 8053, ContainerPort: 53, Protocol: "udp"}},
				"192.0.2.2/24", "2001:db8::2/64")
			if out, err := nettest.Exec(t, "portmap-upstream", "ADD", "c1", "/x", conf); err != nil {
				t.Fatalf("upstream ADD: %v\n%s", err, out)
			}
			chain := iptables.ChainName(plan.Owner{Network: "net1", ContainerID: "c1"})
			if !strings.Contains(nettest.Save(t, 4), chain) {
				t.Fatalf("upstream made no %s", chain)
			}
			if !withMappings {
				delete(conf, "runtimeConfig")
			}
			delete(conf, "prevResult")
			if out, err := nettest.Exec(t, "portmap", "DEL", "c1", "", conf); err != nil {
				t.Fatalf("our DEL: %v\n%s", err, out)
			}
			for _, f := range []int{4, 6} {
				if rules := nettest.Save(t, f); strings.Contains(rules, chain) {
					t.Errorf("IPv%d: upstream's rules survive our DEL:\n%s", f, rules)
				}
			}
		})
	}
}

// TestMarkerChains: ADD's fast path reads no rule; what vouches for the
// shared rules is each mark bit's empty marker chain. A plan with another
// markMasqBit goes to the slow path once and gets its bit's rules; a node
// whose skeleton predates the marker (or lost it) goes to the slow path
// once and gets it back; and what the fast path no longer proves — a
// flush that left our chains but not their rules — CHECK reports.
func TestMarkerChains(t *testing.T) {
	nettest.ResetNAT(t)
	b, c := backend(t, plan.IPv4)
	add := func(p *plan.Plan) int {
		t.Helper()
		*c = counting{Kernel: c.Kernel}
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
		return c.natives + c.restores + c.lists + c.ensures
	}
	if n := add(mkPlan("net1", "a", "192.0.2.2/24", 8080)); n == 1 {
		t.Fatal("the first ADD on a node took the fast path")
	}
	if n := add(mkPlan("net1", "b", "192.0.2.3/24", 8081)); n != 1 {
		t.Errorf("a second ADD of the same bit: %d operations, want the fast path (1)", n)
	}
	bit5 := mkPlan("net1", "c", "192.0.2.4/24", 8082)
	bit5.Masquerade.MarkBit = 5
	if n := add(bit5); n == 1 {
		t.Error("an ADD with bit 5 on a bit-13 node took the fast path")
	}
	rules := nettest.Save(t, 4)
	for _, w := range []string{"--set-xmark 0x20/0x20", "--mark 0x20/0x20 -j MASQUERADE", ":" + iptables.MarkerChain(5), ":" + iptables.MarkerChain(13)} {
		if !strings.Contains(rules, w) {
			t.Errorf("no %q after ADD of bit 5:\n%s", w, rules)
		}
	}
	if err := b.Check(bit5); err != nil {
		t.Errorf("CHECK of bit 5: %v", err)
	}

	// A skeleton without the marker (made before it existed): one slow
	// path brings it back.
	nettest.Run(t, "iptables", "-t", "nat", "-X", iptables.MarkerChain(13))
	if n := add(mkPlan("net1", "d", "192.0.2.5/24", 8083)); n == 1 {
		t.Error("ADD without the marker took the fast path")
	}
	if n := add(mkPlan("net1", "e", "192.0.2.6/24", 8084)); n != 1 {
		t.Errorf("ADD after the marker came back: %d operations, want 1", n)
	}

	// A flush leaves our chains (the marker too) and removes their rules:
	// CHECK of an attachment names what is missing; ADD reads the shared
	// rules over netlink, finds them gone and takes the slow path, which
	// makes them again (the older attachment's own rules stay gone until
	// sync; see the e2e sync tests).
	nettest.Run(t, "iptables", "-t", "nat", "-F")
	e := mkPlan("net1", "e", "192.0.2.6/24", 8084)
	if err := b.Check(e); err == nil || !strings.Contains(err.Error(), "PREROUTING") {
		t.Errorf("CHECK after a flush: %v, want the missing PREROUTING jump named", err)
	}
	f := mkPlan("net1", "f", "192.0.2.7/24", 8085)
	if n := add(f); n == 1 {
		t.Errorf("ADD after a flush took the fast path")
	}
	if err := b.Check(f); err != nil {
		t.Errorf("CHECK of an ADD after a flush: %v", err)
	}
	if err := b.Check(e); err == nil {
		t.Error("CHECK of an attachment the flush emptied passed")
	}
}

// TestCheckOverNetlink: CHECK on iptables-nft finds, from the
// attachment's chain alone, a DNAT rule gone, a rule too many and an entry
// rule gone, and with an iptables-legacy nat table in the namespace it
// judges from one listing of the table instead.
func TestCheckOverNetlink(t *testing.T) {
	p := mkPlan("net1", "chk", "192.0.2.2/24", 8080)
	chain := iptables.ChainName(p.Owner)
	dnat := []string{chain, "-p", "tcp", "--dport", "8080", "-j", "DNAT", "--to-destination", "192.0.2.2:80"}
	for _, tc := range []struct {
		name   string
		change [][]string
		want   string
	}{
		{"DNAT rule gone", [][]string{append([]string{"-D"}, dnat...)}, "missing rule"},
		{"a rule too many", [][]string{{"-A", chain, "-p", "tcp", "--dport", "9", "-j", "ACCEPT"}}, "1 unexpected rules"},
		{"entry rule gone", [][]string{{"-F", iptables.TopLevelDNATChain}}, "0 rules jump to " + chain + ", want 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nettest.ResetNAT(t)
			b, _ := backend(t, plan.IPv4)
			if err := b.Apply(p); err != nil {
				t.Fatal(err)
			}
			if err := b.Check(p); err != nil {
				t.Fatalf("CHECK after ADD: %v", err)
			}
			for _, c := range tc.change {
				nettest.Run(t, "iptables", append([]string{"-t", "nat"}, c...)...)
			}
			if err := b.Check(p); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CHECK: %v, want %q", err, tc.want)
			}
		})
	}
	t.Run("legacy table", func(t *testing.T) {
		n := nettest.NewNS(t)
		err := n.Do(func(ns.NetNS) error {
			b, c := backend(t, plan.IPv4)
			if err := b.Apply(p); err != nil {
				return err
			}
			if out, err := exec.Command("iptables-legacy", "-t", "nat", "-S").CombinedOutput(); err != nil {
				return fmt.Errorf("iptables-legacy: %v: %s", err, out)
			}
			*c = counting{Kernel: c.Kernel}
			if err := b.Check(p); err != nil {
				return fmt.Errorf("CHECK beside a legacy table: %v", err)
			}
			if c.lists != 1 {
				return fmt.Errorf("CHECK beside a legacy table listed the table %d times, want 1", c.lists)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// TestLegacyTableKeepsTheTools: in a namespace where iptables-legacy holds
// a nat table, DEL does not go over nf_tables netlink (those rules are not
// nf_tables'); where none is, it does, and a missing chain is no error.
func TestLegacyTableKeepsTheTools(t *testing.T) {
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		t.Fatalf("iptables-legacy: %v (Debian's iptables package has it)", err)
	}
	n := nettest.NewNS(t)
	err := n.Do(func(ns.NetNS) error {
		b, err := iptables.New(plan.IPv4)
		if err != nil {
			return err
		}
		if found, err := b.Kernel.Unlink(iptables.TopLevelDNATChain, "CNI-DN-nothing"); found || err != nil {
			return fmt.Errorf("no legacy table: Unlink of a missing chain = %v, %v; want false, nil", found, err)
		}
		if out, err := exec.Command("iptables-legacy", "-t", "nat", "-S").CombinedOutput(); err != nil {
			return fmt.Errorf("iptables-legacy: %v: %s", err, out)
		}
		if _, err := b.Kernel.Unlink(iptables.TopLevelDNATChain, "CNI-DN-nothing"); !errors.Is(err, xt.ErrLegacy) {
			return fmt.Errorf("with a legacy nat table: Unlink = %v, want ErrLegacy", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRemoveReadsItsOwnJumps: DEL finds an attachment's jumps in
// CNI-HOSTPORT-DNAT without reading that chain, whose rules grow with the
// attachments (the jumps follow the chain's last rule in the kernel's
// numbering, and the chain's use count says how many there are); with a
// jump written some other way it reads the chain and still removes
// everything; the other attachments stand.
func TestRemoveReadsItsOwnJumps(t *testing.T) {
	nettest.ResetNAT(t)
	b, _ := backend(t, plan.IPv4)
	var plans []*plan.Plan
	for i := range 30 {
		ports := []int{10000 + i}
		if i == 10 { // 40 separate ports: three multiport jumps
			ports = nil
			for j := range 40 {
				ports = append(ports, 30000+2*j)
			}
		}
		p := mkPlan("net1", fmt.Sprintf("c%d", i), fmt.Sprintf("10.1.0.%d/16", i+2), ports...)
		if err := b.Apply(p); err != nil {
			t.Fatalf("Apply c%d: %v", i, err)
		}
		plans = append(plans, p)
	}
	if n := len(iptables.EntryRules(plans[10])); n != 3 {
		t.Fatalf("c10 has %d entry rules, want 3", n)
	}
	// By hand, after everyone's ADD: a second jump to c20's chain.
	c20 := iptables.ChainName(plans[20].Owner)
	if out, err := exec.Command("iptables", "-t", "nat", "-A", iptables.TopLevelDNATChain, "-p", "udp", "--dport", "9999", "-j", c20).CombinedOutput(); err != nil {
		t.Fatalf("iptables: %v: %s", err, out)
	}
	for _, tt := range []struct {
		i        int
		fallback bool
	}{{5, false}, {10, false}, {29, false}, {20, true}} {
		chain := iptables.ChainName(plans[tt.i].Owner)
		found, read, err := xt.Unlink(plan.IPv4, iptables.TopLevelDNATChain, chain)
		if err != nil || !found {
			t.Fatalf("Unlink c%d: found %v, %v", tt.i, found, err)
		}
		t.Logf("c%d: read %d rules of %s", tt.i, read, iptables.TopLevelDNATChain)
		switch {
		case !tt.fallback && read > len(iptables.EntryRules(plans[tt.i]))+4:
			t.Errorf("Unlink c%d read %d rules of %s, want only its own jumps (and a few handles after)", tt.i, read, iptables.TopLevelDNATChain)
		case tt.fallback && read < 30:
			t.Errorf("Unlink c%d (a jump written by hand) read %d rules of %s, want the whole chain", tt.i, read, iptables.TopLevelDNATChain)
		}
		if rules := nettest.Save(t, 4); strings.Contains(rules, chain) {
			t.Errorf("after Unlink c%d, its chain is left:\n%s", tt.i, rules)
		}
	}
	for i, p := range plans {
		if i == 5 || i == 10 || i == 20 || i == 29 {
			continue
		}
		if err := b.Check(p); err != nil {
			t.Errorf("Check c%d after the others' removal: %v", i, err)
		}
	}
	if found, read, err := xt.Unlink(plan.IPv4, iptables.TopLevelDNATChain, iptables.ChainName(plans[5].Owner)); found || read != 0 || err != nil {
		t.Errorf("second Unlink of c5: found %v, read %d, %v; want nothing", found, read, err)
	}
}

// TestExternalSetMarkChainMissing: "externalSetMarkChain": "KUBE-MARK-MASQ"
// on a node without that chain (kube-proxy in nftables mode keeps its
// mark to itself) fails ADD with mappings as an invalid configuration
// (code 7) naming the key, the chain, why and the fix, and writes
// nothing; ADD without mappings, DEL and STATUS answer as usual. Once
// the chain exists (kube-proxy in iptables mode), ADD, CHECK and DEL
// work and DEL leaves kube-proxy's chain alone.
func TestExternalSetMarkChainMissing(t *testing.T) {
	nettest.ResetNAT(t)
	conf := nettest.PortmapConf("net1", "iptables", []nettest.Mapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}}, "192.0.2.2/24")
	conf["externalSetMarkChain"] = "KUBE-MARK-MASQ"
	before := nettest.Save(t, 4)
	out, err := nettest.Exec(t, "portmap", "ADD", "c1", "/x", conf)
	var cniErr struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if err == nil || json.Unmarshal(out, &cniErr) != nil || cniErr.Code != 7 {
		t.Fatalf("ADD: %v %s, want CNI error code 7", err, out)
	}
	for _, want := range []string{`invalid externalSetMarkChain "KUBE-MARK-MASQ"`, "no chain KUBE-MARK-MASQ", "nftables mode", "remove the key"} {
		if !strings.Contains(cniErr.Msg, want) {
			t.Errorf("ADD's message %q lacks %q", cniErr.Msg, want)
		}
	}
	if after := nettest.Save(t, 4); after != before {
		t.Errorf("the refused ADD changed the nat table:\n%s\nbefore:\n%s", after, before)
	}
	bare := maps.Clone(conf)
	bare["runtimeConfig"] = map[string]any{}
	for _, verb := range []string{"ADD", "DEL"} {
		if out, err := nettest.Exec(t, "portmap", verb, "c2", "/x", bare); err != nil {
			t.Errorf("%s without mappings: %v %s", verb, err, out)
		}
	}
	if out, err := nettest.Exec(t, "portmap", "DEL", "c1", "/x", conf); err != nil {
		t.Errorf("DEL after the refused ADD: %v %s", err, out)
	}
	status := maps.Clone(conf)
	status["cniVersion"] = "1.1.0"
	delete(status, "prevResult")
	delete(status, "runtimeConfig")
	if out, err := nettest.Exec(t, "portmap", "STATUS", "", "", status); err != nil {
		t.Errorf("STATUS: %v %s", err, out)
	}

	// kube-proxy in iptables mode: its chain sets its mark bit (14)
	nettest.Run(t, "iptables", "-t", "nat", "-N", "KUBE-MARK-MASQ")
	nettest.Run(t, "iptables", "-t", "nat", "-A", "KUBE-MARK-MASQ", "-j", "MARK", "--set-xmark", "0x4000/0x4000")
	for _, verb := range []string{"ADD", "CHECK", "DEL"} {
		if out, err := nettest.Exec(t, "portmap", verb, "c1", "/x", conf); err != nil {
			t.Fatalf("%s with kube-proxy's chain: %v %s", verb, err, out)
		}
		if verb == "ADD" && !strings.Contains(nettest.Save(t, 4), "-j KUBE-MARK-MASQ") {
			t.Errorf("no hairpin rule jumps to KUBE-MARK-MASQ:\n%s", nettest.Save(t, 4))
		}
	}
	if rules := nettest.Save(t, 4); !strings.Contains(rules, "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000") ||
		strings.Contains(rules, iptables.ChainName(plan.Owner{Network: "net1", ContainerID: "c1"})) {
		t.Errorf("after DEL, kube-proxy's chain must stay and the attachment go:\n%s", rules)
	}
}
