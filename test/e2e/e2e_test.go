package e2e

import (
	"fmt"
	"maps"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

const (
	nodeIP   = "198.51.100.1"
	nodeIP2  = "198.51.100.10"
	nodeIP6  = "2001:db8:2::1"
	clientIP = "198.51.100.2"
	clientV6 = "2001:db8:2::2"
	// srvPort is where every container serves TCP and UDP.
	srvPort = 80
)

func client(t *testing.T) *nettest.Client {
	return nettest.NewClient(t, nettest.ClientNet{HostIf: "pmcl0", V4: "198.51.100", V6: "2001:db8:2:"})
}

func addr(ip string, port int) string { return fmt.Sprintf("[%s]:%d", ip, port) }

// expectReply asserts that a request reaches server name and that the server
// sees the source src ("" = any).
func expectReply(t *testing.T, from *nettest.Client, proto, to, name, src string) {
	t.Helper()
	var got string
	var err error
	if from == nil {
		got, err = nettest.Dial(nil, proto, to)
	} else {
		got, err = nettest.Dial(from.NS, proto, to)
	}
	if err != nil {
		t.Errorf("%s to %s: %v", proto, to, err)
		return
	}
	want := name + " sees "
	if !strings.HasPrefix(got, want) || (src != "" && got != want+src) {
		t.Errorf("%s to %s: reply %q, want %q%s", proto, to, got, want, src)
	}
}

func expectNoReply(t *testing.T, from *nettest.Client, proto, to string) {
	t.Helper()
	if got, err := nettest.Dial(from.NS, proto, to); err == nil {
		t.Errorf("%s to %s answered %q, want no answer", proto, to, got)
	}
}

// TestTraffic is the main job: ADD through libcni, then TCP and UDP through
// the host port from a client, from localhost, from the container itself
// (hairpin), over IPv6, and a hostIP-restricted port; then CHECK and DEL.
func TestTraffic(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		for _, main := range []string{"ptp", "bridge"} {
			t.Run(main, func(t *testing.T) { traffic(t, main, extra) })
		}
	})
}

func traffic(t *testing.T, main string, extra map[string]string) {
	cl := client(t)
	nettest.AddHostAddr(t, "pmcl0", nodeIP2+"/24")
	rt := nettest.NewRuntime(t, nettest.Net{Name: "traffic-" + main, Main: main, Bridge: "pmbr0",
		V4: "192.0.2.0/27", V6: "2001:db8:1:1::/64", Extra: extra})
	c := rt.MustAdd(t, "c-"+main,
		nettest.Mapping{HostPort: 8080, ContainerPort: srvPort, Protocol: "tcp"},
		nettest.Mapping{HostPort: 8053, ContainerPort: srvPort, Protocol: "udp"},
		nettest.Mapping{HostPort: 8081, ContainerPort: srvPort, HostIP: nodeIP},
	)
	nettest.Serve(t, c.NS, "c1", srvPort)

	t.Run("tcp keeps client source", func(t *testing.T) { expectReply(t, cl, "tcp", addr(nodeIP, 8080), "c1", clientIP) })
	t.Run("udp keeps client source", func(t *testing.T) { expectReply(t, cl, "udp", addr(nodeIP, 8053), "c1", clientIP) })
	t.Run("localhost", func(t *testing.T) { expectReply(t, nil, "tcp", addr("127.0.0.1", 8080), "c1", "") })
	t.Run("hairpin", func(t *testing.T) {
		got, err := nettest.Dial(c.NS, "tcp", addr(nodeIP, 8080))
		if err != nil || !strings.HasPrefix(got, "c1 sees ") || got == "c1 sees "+c.IP(4) {
			t.Errorf("hairpin: %q, %v; want an answer from a masqueraded source", got, err)
		}
	})
	t.Run("ipv6", func(t *testing.T) { expectReply(t, cl, "tcp", addr(nodeIP6, 8080), "c1", clientV6) })
	t.Run("hostIP only on its address", func(t *testing.T) {
		expectReply(t, cl, "tcp", addr(nodeIP, 8081), "c1", clientIP)
		expectNoReply(t, cl, "tcp", addr(nodeIP2, 8081))
		expectReply(t, cl, "tcp", addr(nodeIP2, 8080), "c1", clientIP)
	})
	t.Run("check", func(t *testing.T) {
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK: %v", err)
		}
	})
	if err := rt.Del(c); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	expectNoReply(t, cl, "tcp", addr(nodeIP, 8080))
	if err := rt.Del(c); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

func TestTwoContainersDelOne(t *testing.T) {
	forBackends(t, func(t *testing.T, _ backend, extra map[string]string) { twoContainersDelOne(t, extra) })
}

func twoContainersDelOne(t *testing.T, extra map[string]string) {
	cl := client(t)
	rt := nettest.NewRuntime(t, nettest.Net{Name: "two", V4: "192.0.2.32/27", V6: "2001:db8:1:2::/64", Extra: extra})
	a := rt.MustAdd(t, "a", nettest.Mapping{HostPort: 8080, ContainerPort: srvPort})
	b := rt.MustAdd(t, "b", nettest.Mapping{HostPort: 8090, ContainerPort: srvPort})
	nettest.Serve(t, a.NS, "a", srvPort)
	nettest.Serve(t, b.NS, "b", srvPort)
	expectReply(t, cl, "tcp", addr(nodeIP, 8080), "a", clientIP)
	expectReply(t, cl, "tcp", addr(nodeIP, 8090), "b", clientIP)
	if err := rt.Del(a); err != nil {
		t.Fatalf("DEL a: %v", err)
	}
	expectNoReply(t, cl, "tcp", addr(nodeIP, 8080))
	expectReply(t, cl, "tcp", addr(nodeIP, 8090), "b", clientIP)
	expectReply(t, cl, "tcp", addr(nodeIP6, 8090), "b", clientV6)
	if err := rt.Check(b); err != nil {
		t.Errorf("CHECK b after DEL a: %v", err)
	}
}

// TestDelLeavesNothing diffs the rulesets: after ADD and DEL of a container
// the nat tables are exactly what they were.
func TestDelLeavesNothing(t *testing.T) {
	forBackends(t, delLeavesNothing)
}

func delLeavesNothing(t *testing.T, b backend, extra map[string]string) {
	rt := nettest.NewRuntime(t, nettest.Net{Name: "clean", V4: "192.0.2.64/27", V6: "2001:db8:1:3::/64", Extra: extra})
	rt.MustAdd(t, "first", nettest.Mapping{HostPort: 7000, ContainerPort: srvPort})
	before := b.ruleset(t)
	c := rt.MustAdd(t, "second",
		nettest.Mapping{HostPort: 7001, ContainerPort: srvPort},
		nettest.Mapping{HostPort: 7001, ContainerPort: srvPort, Protocol: "udp"},
		nettest.Mapping{HostPort: 7002, ContainerPort: srvPort, Protocol: "sctp"})
	chain := b.chain(plan.Owner{Network: "clean", ContainerID: "second", IfName: "eth0"})
	if got := strings.Count(b.ruleset(t), chain); got < 2 {
		t.Fatalf("ADD made chain %s in %d places, want both families", chain, got)
	}
	if err := rt.Del(c); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if after := b.ruleset(t); after != before {
		t.Errorf("ruleset after DEL differs:\n--- before\n%s\n--- after\n%s", before, after)
	}
}

func TestCheckDetectsTampering(t *testing.T) {
	forBackends(t, checkDetectsTampering)
}

func checkDetectsTampering(t *testing.T, b backend, extra map[string]string) {
	rt := nettest.NewRuntime(t, nettest.Net{Name: "tamper", V4: "192.0.2.96/27", Extra: extra})
	c := rt.MustAdd(t, "t1", nettest.Mapping{HostPort: 7100, ContainerPort: srvPort})
	if err := rt.Check(c); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	owner := plan.Owner{Network: "tamper", ContainerID: "t1", IfName: "eth0"}
	b.deleteDNAT(t, owner, c, 7100)
	err := rt.Check(c)
	if err == nil || !strings.Contains(err.Error(), "missing ") || !strings.Contains(err.Error(), "7100") {
		t.Errorf("CHECK after deleting the DNAT rule: %v, want it named", err)
	}
	if err != nil && !strings.Contains(err.Error(), b.name+" backend") {
		t.Errorf("CHECK error %q does not say which backend is in use", err)
	}
	// ADD again repairs it.
	if out, err := rt.ExecPortmap(t, c, "ADD"); err != nil {
		t.Fatalf("re-ADD: %v\n%s", err, out)
	}
	if err := rt.Check(c); err != nil {
		t.Fatalf("CHECK after re-ADD: %v", err)
	}
	missing, repair := b.breakShared(t)
	if err := rt.Check(c); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("CHECK after breaking the %s jump: %v, want it named", missing, err)
	}
	repair()
	var hostIf string
	for _, i := range c.Result.Interfaces {
		if i.Sandbox == "" {
			hostIf = i.Name
		}
	}
	nettest.Run(t, "sysctl", "-qw", "net.ipv4.conf."+hostIf+".route_localnet=0")
	if err := rt.Check(c); err == nil || !strings.Contains(err.Error(), "route_localnet") {
		t.Errorf("CHECK after turning route_localnet off: %v, want it named", err)
	}
}

func TestCNIVersions(t *testing.T) {
	forBackends(t, func(t *testing.T, _ backend, extra map[string]string) { cniVersions(t, extra) })
}

func cniVersions(t *testing.T, extra map[string]string) {
	cl := client(t)
	for i, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			rt := nettest.NewRuntime(t, nettest.Net{Name: "ver-" + strings.ReplaceAll(v, ".", ""), CNIVersion: v,
				V4: fmt.Sprintf("192.0.2.%d/28", 128+16*i), V6: fmt.Sprintf("2001:db8:1:1%d::/64", i), Extra: extra})
			port := 7200 + i
			c := rt.MustAdd(t, "v", nettest.Mapping{HostPort: port, ContainerPort: srvPort})
			nettest.Serve(t, c.NS, "v"+v, srvPort)
			expectReply(t, cl, "tcp", addr(nodeIP, port), "v"+v, clientIP)
			expectReply(t, cl, "tcp", addr(nodeIP6, port), "v"+v, clientV6)
			if v != "0.3.1" {
				if err := rt.Check(c); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			if err := rt.Del(c); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			expectNoReply(t, cl, "tcp", addr(nodeIP, port))
		})
	}
}

// TestParallel runs 20 ADDs at once on a fresh node (no shared chains yet),
// then 20 DELs at once.
func TestParallel(t *testing.T) {
	forBackends(t, parallel)
}

func parallel(t *testing.T, b backend, extra map[string]string) {
	nettest.ResetNAT(t)
	cl := client(t)
	rt := nettest.NewRuntime(t, nettest.Net{Name: "par", V4: "192.0.2.192/26", V6: "2001:db8:1:20::/64", Extra: extra})
	const n = 20
	cs := make([]*nettest.Container, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs[i], errs[i] = rt.Add(t, fmt.Sprintf("p%02d", i), nettest.Mapping{HostPort: 9000 + i, ContainerPort: srvPort})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD p%02d: %v", i, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	for _, i := range []int{0, n / 2, n - 1} {
		nettest.Serve(t, cs[i].NS, fmt.Sprintf("p%02d", i), srvPort)
		expectReply(t, cl, "tcp", addr(nodeIP, 9000+i), fmt.Sprintf("p%02d", i), clientIP)
	}
	rules := b.ruleset(t)
	// Shared rules, with how often each family must have them.
	shared := map[string]int{"-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT": 1,
		"-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT": 1, "-j CNI-HOSTPORT-MASQ": 1}
	entry := "-A CNI-HOSTPORT-DNAT "
	if b.name == "nftables" {
		shared = map[string]int{"fib daddr type local jump dispatch": 2, "vmap @hostports": 1, "masquerade\n": 1}
		entry = "chain dn-"
	}
	for s, want := range shared {
		if got := strings.Count(rules, s); got != 2*want {
			t.Errorf("%q appears %d times, want %d per family", s, got, want)
		}
	}
	if got := strings.Count(rules, entry); got != 2*n {
		t.Errorf("%d attachments in the ruleset, want %d per family", got, n)
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = rt.Del(cs[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("DEL p%02d: %v", i, err)
		}
	}
	if rules := b.ruleset(t); strings.Contains(rules, "CNI-DN-") || strings.Contains(rules, entry) || strings.Contains(rules, "goto dn-") {
		t.Errorf("per-container rules left after DEL:\n%s", rules)
	}
}

// TestSamePortNewestWins: ADD A and ADD B with the same host port: new
// connections go to B (the newest); DEL A leaves B's mapping in place.
func TestSamePortNewestWins(t *testing.T) {
	forBackends(t, func(t *testing.T, _ backend, extra map[string]string) {
		cl := client(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "same", V4: "192.0.2.176/28", V6: "2001:db8:1:40::/64", Extra: extra})
		a := rt.MustAdd(t, "a", nettest.Mapping{HostPort: 7400, ContainerPort: srvPort})
		nettest.Serve(t, a.NS, "a", srvPort)
		expectReply(t, cl, "tcp", addr(nodeIP, 7400), "a", clientIP)
		b := rt.MustAdd(t, "b", nettest.Mapping{HostPort: 7400, ContainerPort: srvPort})
		nettest.Serve(t, b.NS, "b", srvPort)
		expectReply(t, cl, "tcp", addr(nodeIP, 7400), "b", clientIP)
		if err := rt.Del(a); err != nil {
			t.Fatalf("DEL a: %v", err)
		}
		expectReply(t, cl, "tcp", addr(nodeIP, 7400), "b", clientIP)
		expectReply(t, cl, "tcp", addr(nodeIP6, 7400), "b", clientV6)
		if err := rt.Check(b); err != nil {
			t.Errorf("CHECK b: %v", err)
		}
	})
}

// upstreamRuns reports whether upstream's portmap can serve backend b
// with the node's tools: its nftables backend (knftables) runs nft, and
// refuses one before 1.0.1 (Debian 11's 0.9.8).
func upstreamRuns(t *testing.T, b backend) bool {
	return b.name != "nftables" || !strings.HasPrefix(nettest.NftRelease(t), "0.")
}

// TestUpstreamToOurs: a container set up by the upstream plugin is torn down
// by ours (a node switching plugins leaks nothing).
func TestUpstreamToOurs(t *testing.T) {
	forBackends(t, upstreamToOurs)
}

func upstreamToOurs(t *testing.T, b backend, extra map[string]string) {
	// A node the upstream plugin ran on: no localhost guard (ours adds it).
	nettest.ResetNAT(t)
	for _, args := range [][]string{{"-D", "INPUT", "-j", iptables.GuardChain}, {"-F", iptables.GuardChain}, {"-X", iptables.GuardChain}} {
		_ = exec.Command("iptables", args...).Run()
	}
	cl := client(t)
	net := nettest.Net{Name: "upgrade", V4: "192.0.2.160/28", V6: "2001:db8:1:30::/64", Portmap: "portmap-upstream", DataDir: t.TempDir(), Extra: extra}
	up := nettest.NewRuntime(t, net)
	// Upstream needs the protocol spelled out.
	c, err := up.Add(t, "old", nettest.Mapping{HostPort: 7300, ContainerPort: srvPort, Protocol: "tcp"})
	if !upstreamRuns(t, b) {
		// no upstream attachment to take over on such a node
		if err == nil || !strings.Contains(err.Error(), "nft version") {
			t.Fatalf("upstream ADD with nft %s: %v, want its refusal of the nft release", nettest.NftRelease(t), err)
		}
		return
	}
	if err != nil {
		t.Fatalf("upstream ADD: %v", err)
	}
	nettest.Serve(t, c.NS, "old", srvPort)
	expectReply(t, cl, "tcp", addr(nodeIP, 7300), "old", clientIP)
	net.Portmap = "portmap"
	ours := up.WithList(t, net)
	if b.name == "iptables" {
		// Our CHECK says what upstream never made: the localhost guard.
		if err := ours.Check(c); err == nil || !strings.Contains(err.Error(), "CNI-HOSTPORT-GUARD") || !strings.Contains(err.Error(), "filter") {
			t.Errorf("our CHECK of upstream's rules on a node without the guard: %v, want the guard named", err)
		}
		// Once one ADD of ours made it, the same layout and names mean our
		// CHECK understands upstream's rules.
		ours.MustAdd(t, "new", nettest.Mapping{HostPort: 7301, ContainerPort: srvPort})
		if err := ours.Check(c); err != nil {
			t.Errorf("our CHECK of upstream's rules: %v", err)
		}
	}
	if err := ours.Del(c); err != nil {
		t.Fatalf("our DEL: %v", err)
	}
	var rules string
	if b.name == "iptables" {
		rules = nettest.Save(t, 4) + nettest.Save(t, 6)
	} else {
		rules = nettest.Run(t, "nft", "list", "ruleset")
	}
	for _, left := range []string{iptables.ChainName(plan.Owner{Network: "upgrade", ContainerID: "old"}), `comment "old"`} {
		if strings.Contains(rules, left) {
			t.Errorf("upstream's rules (%s) survive our DEL:\n%s", left, rules)
		}
	}
	expectNoReply(t, cl, "tcp", addr(nodeIP, 7300))
}

// TestMasqAll: with masqAll every connection through a host port is
// masqueraded (nftables: a flat attachment's hairpin_0 element), not only
// those from the container's subnet.
func TestMasqAll(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		cl := client(t)
		extra = maps.Clone(extra)
		extra["masqAll"] = "true"
		rt := nettest.NewRuntime(t, nettest.Net{Name: "masqall", V4: "192.0.2.64/27", Extra: extra})
		c := rt.MustAdd(t, "m1", nettest.Mapping{HostPort: 7300, ContainerPort: srvPort})
		nettest.Serve(t, c.NS, "m1", srvPort)
		got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, 7300))
		if err != nil || !strings.HasPrefix(got, "m1 sees ") || got == "m1 sees "+clientIP {
			t.Errorf("a client's connection with masqAll: %q, %v; want an answer from a masqueraded source", got, err)
		}
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK: %v", err)
		}
		if err := rt.Del(c); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		expectNoReply(t, cl, "tcp", addr(nodeIP, 7300))
	})
}

// TestRollbackToUpstream: a node rolled back to upstream portmap (iptables
// backend, whose chain names and comments we keep) tears down what ours
// set up: upstream's DEL of our attachment, written on the native fast
// path, leaves none of its rules and stops its host port, and another
// attachment of ours keeps working. (Our nftables backend keeps tables of
// its own, which upstream's nftables backend does not read: docs/compat.md.)
func TestRollbackToUpstream(t *testing.T) {
	nettest.ResetNAT(t)
	cl := client(t)
	net := nettest.Net{Name: "rollback", V4: "192.0.2.176/28", V6: "2001:db8:1:31::/64", DataDir: t.TempDir(), Extra: map[string]string{"backend": `"iptables"`}}
	ours := nettest.NewRuntime(t, net)
	keep := ours.MustAdd(t, "keep", nettest.Mapping{HostPort: 7400, ContainerPort: srvPort, Protocol: "tcp"})
	gone := ours.MustAdd(t, "gone", nettest.Mapping{HostPort: 7401, ContainerPort: srvPort, Protocol: "tcp"},
		nettest.Mapping{HostPort: 7402, ContainerPort: srvPort, Protocol: "udp"})
	nettest.Serve(t, keep.NS, "keep", srvPort)
	nettest.Serve(t, gone.NS, "gone", srvPort)
	expectReply(t, cl, "tcp", addr(nodeIP, 7401), "gone", clientIP)
	net.Portmap = "portmap-upstream"
	up := ours.WithList(t, net)
	if err := up.Del(gone); err != nil {
		t.Fatalf("upstream's DEL of our attachment: %v", err)
	}
	rules := nettest.Save(t, 4) + nettest.Save(t, 6)
	for _, left := range []string{iptables.ChainName(plan.Owner{Network: "rollback", ContainerID: "gone"}), `id: \"gone\"`} {
		if strings.Contains(rules, left) {
			t.Errorf("our rules (%s) survive upstream's DEL:\n%s", left, rules)
		}
	}
	expectNoReply(t, cl, "tcp", addr(nodeIP, 7401))
	expectReply(t, cl, "tcp", addr(nodeIP, 7400), "keep", clientIP)
	if err := up.Check(keep); err != nil {
		t.Errorf("upstream's CHECK of our other attachment: %v", err)
	}
}
