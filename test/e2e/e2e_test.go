package e2e

import (
	"fmt"
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
	for _, main := range []string{"ptp", "bridge"} {
		t.Run(main, func(t *testing.T) {
			cl := client(t)
			nettest.AddHostAddr(t, "pmcl0", nodeIP2+"/24")
			rt := nettest.NewRuntime(t, nettest.Net{Name: "traffic-" + main, Main: main, Bridge: "pmbr0",
				V4: "192.0.2.0/27", V6: "2001:db8:1:1::/64"})
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
		})
	}
}

func TestTwoContainersDelOne(t *testing.T) {
	cl := client(t)
	rt := nettest.NewRuntime(t, nettest.Net{Name: "two", V4: "192.0.2.32/27", V6: "2001:db8:1:2::/64"})
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
	rt := nettest.NewRuntime(t, nettest.Net{Name: "clean", V4: "192.0.2.64/27", V6: "2001:db8:1:3::/64"})
	rt.MustAdd(t, "first", nettest.Mapping{HostPort: 7000, ContainerPort: srvPort})
	before4, before6 := nettest.Save(t, 4), nettest.Save(t, 6)
	c := rt.MustAdd(t, "second",
		nettest.Mapping{HostPort: 7001, ContainerPort: srvPort},
		nettest.Mapping{HostPort: 7001, ContainerPort: srvPort, Protocol: "udp"},
		nettest.Mapping{HostPort: 7002, ContainerPort: srvPort, Protocol: "sctp"})
	chain := iptables.ChainName(plan.Owner{Network: "clean", ContainerID: "second"})
	if !strings.Contains(nettest.Save(t, 4), chain) || !strings.Contains(nettest.Save(t, 6), chain) {
		t.Fatalf("ADD made no chain %s", chain)
	}
	if err := rt.Del(c); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if after := nettest.Save(t, 4); after != before4 {
		t.Errorf("IPv4 nat table after DEL differs:\n--- before\n%s\n--- after\n%s", before4, after)
	}
	if after := nettest.Save(t, 6); after != before6 {
		t.Errorf("IPv6 nat table after DEL differs:\n--- before\n%s\n--- after\n%s", before6, after)
	}
}

func TestCheckDetectsTampering(t *testing.T) {
	rt := nettest.NewRuntime(t, nettest.Net{Name: "tamper", V4: "192.0.2.96/27"})
	c := rt.MustAdd(t, "t1", nettest.Mapping{HostPort: 7100, ContainerPort: srvPort})
	if err := rt.Check(c); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	chain := iptables.ChainName(plan.Owner{Network: "tamper", ContainerID: "t1"})
	dnat := "-p tcp --dport 7100 -j DNAT --to-destination " + c.IP(4) + ":80"
	nettest.Run(t, "iptables", append([]string{"-t", "nat", "-D", chain}, strings.Fields(dnat)...)...)
	err := rt.Check(c)
	if err == nil || !strings.Contains(err.Error(), "missing rule") || !strings.Contains(err.Error(), "DNAT") {
		t.Errorf("CHECK after deleting the DNAT rule: %v, want it named", err)
	}
	// ADD again repairs it.
	if out, err := rt.ExecPortmap(t, c, "ADD"); err != nil {
		t.Fatalf("re-ADD: %v\n%s", err, out)
	}
	if err := rt.Check(c); err != nil {
		t.Fatalf("CHECK after re-ADD: %v", err)
	}
	nettest.Run(t, "iptables", "-t", "nat", "-D", "OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-j", iptables.TopLevelDNATChain)
	if err := rt.Check(c); err == nil || !strings.Contains(err.Error(), "OUTPUT") {
		t.Errorf("CHECK after deleting the OUTPUT jump: %v, want it named", err)
	}
	nettest.Run(t, "iptables", "-t", "nat", "-A", "OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-j", iptables.TopLevelDNATChain)
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
	cl := client(t)
	for i, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			rt := nettest.NewRuntime(t, nettest.Net{Name: "ver-" + strings.ReplaceAll(v, ".", ""), CNIVersion: v,
				V4: fmt.Sprintf("192.0.2.%d/28", 128+16*i), V6: fmt.Sprintf("2001:db8:1:1%d::/64", i)})
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
	nettest.ResetNAT(t)
	cl := client(t)
	rt := nettest.NewRuntime(t, nettest.Net{Name: "par", V4: "192.0.2.192/26", V6: "2001:db8:1:20::/64"})
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
	for _, fam := range []int{4, 6} {
		rules := nettest.Save(t, fam)
		for _, jump := range []string{"-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT", "-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT", "-j CNI-HOSTPORT-MASQ"} {
			if got := strings.Count(rules, jump); got != 1 {
				t.Errorf("IPv%d: %q appears %d times, want once", fam, jump, got)
			}
		}
		if got := strings.Count(rules, "-A CNI-HOSTPORT-DNAT "); got != n {
			t.Errorf("IPv%d: %d entry rules, want %d", fam, got, n)
		}
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
	for _, fam := range []int{4, 6} {
		rules := nettest.Save(t, fam)
		if strings.Contains(rules, "CNI-DN-") || strings.Contains(rules, "-A CNI-HOSTPORT-DNAT ") {
			t.Errorf("IPv%d: per-container rules left after DEL:\n%s", fam, rules)
		}
	}
}

// TestUpstreamToOurs: a container set up by the upstream plugin is torn down
// by ours (a node switching plugins leaks nothing).
func TestUpstreamToOurs(t *testing.T) {
	cl := client(t)
	net := nettest.Net{Name: "upgrade", V4: "192.0.2.160/28", V6: "2001:db8:1:30::/64", Portmap: "portmap-upstream", DataDir: t.TempDir()}
	up := nettest.NewRuntime(t, net)
	// Upstream needs the protocol spelled out.
	c, err := up.Add(t, "old", nettest.Mapping{HostPort: 7300, ContainerPort: srvPort, Protocol: "tcp"})
	if err != nil {
		t.Fatalf("upstream ADD: %v", err)
	}
	nettest.Serve(t, c.NS, "old", srvPort)
	expectReply(t, cl, "tcp", addr(nodeIP, 7300), "old", clientIP)
	net.Portmap = "portmap"
	ours := up.WithList(t, net)
	if err := ours.Check(c); err != nil {
		t.Errorf("our CHECK of upstream's rules: %v", err)
	}
	if err := ours.Del(c); err != nil {
		t.Fatalf("our DEL: %v", err)
	}
	chain := iptables.ChainName(plan.Owner{Network: "upgrade", ContainerID: "old"})
	for _, fam := range []int{4, 6} {
		if rules := nettest.Save(t, fam); strings.Contains(rules, chain) {
			t.Errorf("IPv%d: upstream's rules survive our DEL:\n%s", fam, rules)
		}
	}
	expectNoReply(t, cl, "tcp", addr(nodeIP, 7300))
}
