package kernel

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

// countingNFT counts the transactions a verb commits.
type countingNFT struct {
	nftables.Kernel
	runs int
}

func (c *countingNFT) Apply(tx *nft.Tx) error { c.runs++; return c.Kernel.Apply(tx) }

func nftBackend(t *testing.T, f plan.Family) (*nftables.Backend, *countingNFT) {
	t.Helper()
	b, err := nftables.New(f, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := &countingNFT{Kernel: b.Kernel}
	b.Kernel = c
	return b, c
}

func nftTable(t *testing.T, fam string) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", fam, nftables.Table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	return string(out)
}

func TestNFTApplyCheckRemove(t *testing.T) {
	nettest.ResetNAT(t)
	for _, tt := range []struct {
		f   plan.Family
		ip  string
		fam string
	}{{plan.IPv4, "192.0.2.2/24", "ip"}, {plan.IPv6, "2001:db8::2/64", "ip6"}} {
		t.Run(tt.f.String(), func(t *testing.T) {
			b, c := nftBackend(t, tt.f)
			p := mkPlan("net1", "c1", tt.ip, 8080, 8443)
			if err := b.Check(p); err == nil {
				t.Fatal("Check before Apply succeeded")
			}
			// The first attachment on a node writes the skeleton (slow
			// path); the steady state is measured on the next.
			first := mkPlan("net1", "c0", tt.ip, 7000)
			if err := b.Apply(first); err != nil {
				t.Fatalf("Apply first: %v", err)
			}
			// No process: with an empty PATH, nft (or anything) cannot
			// run, and ADD, CHECK and DEL still work, in one transaction
			// each.
			path := os.Getenv("PATH")
			t.Setenv("PATH", t.TempDir())
			c.runs = 0
			if err := b.Apply(p); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if c.runs != 1 {
				t.Errorf("ADD committed %d transactions, want 1", c.runs)
			}
			if err := b.Check(p); err != nil {
				t.Fatalf("Check: %v", err)
			}
			c.runs = 0
			if err := b.Remove(p); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			if c.runs != 1 {
				t.Errorf("DEL committed %d transactions, want 1", c.runs)
			}
			t.Setenv("PATH", path)
			if err := b.Check(p); err == nil || !strings.Contains(err.Error(), nftables.ChainName(p.Owner)) {
				t.Errorf("Check after Remove: %v, want the missing chain named", err)
			}
			if err := b.Remove(p); err != nil {
				t.Errorf("second Remove: %v", err)
			}
			if err := b.Remove(first); err != nil {
				t.Fatalf("Remove first: %v", err)
			}
			// Only the skeleton is left: no attachment chain, empty maps.
			table := nftTable(t, tt.fam)
			if strings.Contains(table, "dn-") || strings.Contains(table, "elements") {
				t.Errorf("left after the last DEL:\n%s", table)
			}
		})
	}
}

// TestNFTReAddReplaces: re-ADD with other ports and another IP drops the
// old keys and rules; nothing is duplicated.
func TestNFTReAddReplaces(t *testing.T) {
	nettest.ResetNAT(t)
	b, _ := nftBackend(t, plan.IPv4)
	if err := b.Apply(mkPlan("net1", "c1", "192.0.2.2/24", 8080, 8081)); err != nil {
		t.Fatal(err)
	}
	p2 := mkPlan("net1", "c1", "192.0.2.3/24", 9090)
	if err := b.Apply(p2); err != nil {
		t.Fatalf("re-ADD: %v", err)
	}
	table := nftTable(t, "ip")
	for _, stale := range []string{"192.0.2.2", "8080", "8081"} {
		if strings.Contains(table, stale) {
			t.Errorf("stale %q survives re-ADD:\n%s", stale, table)
		}
	}
	if n := strings.Count(table, ": 192.0.2.3 . 80"); n != 1 {
		t.Errorf("%d DNAT elements after re-ADD, want 1:\n%s", n, table)
	}
	if err := b.Check(p2); err != nil {
		t.Errorf("Check: %v", err)
	}
	if err := b.Remove(mkPlan("net1", "c1", "192.0.2.3/24")); err != nil {
		t.Fatalf("Remove without mappings: %v", err)
	}
	if table := nftTable(t, "ip"); strings.Contains(table, "dn-") || strings.Contains(table, "elements") {
		t.Errorf("left after DEL without mappings:\n%s", table)
	}
}

// TestNFTSamePortAndIP: ADD A and ADD B with the same port and IP; DEL A
// leaves B's element and chain.
func TestNFTSamePortAndIP(t *testing.T) {
	nettest.ResetNAT(t)
	b, _ := nftBackend(t, plan.IPv4)
	a, bb := mkPlan("net1", "A", "192.0.2.9/24", 8080), mkPlan("net1", "B", "192.0.2.9/24", 8080)
	for _, p := range []*plan.Plan{a, bb} {
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Check(a); err == nil {
		t.Error("Check A after B took its port succeeded")
	}
	if err := b.Remove(a); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(bb); err != nil {
		t.Errorf("B after DEL A: %v", err)
	}
	if table := nftTable(t, "ip"); strings.Contains(table, nftables.ChainName(a.Owner)) {
		t.Errorf("A's chain survives:\n%s", table)
	}
}

// TestNFTOneLookupPerConnection counts, with nft trace, the rules the first
// packet of a new connection meets in our table, with 1 and with 1000
// attachments installed: the count must not grow.
func TestNFTOneLookupPerConnection(t *testing.T) {
	nettest.ResetNAT(t)
	b, _ := nftBackend(t, plan.IPv4)
	probe := mkPlan("net1", "probe", "192.0.2.2/24", 8080)
	if err := b.Apply(probe); err != nil {
		t.Fatal(err)
	}
	nettest.Run(t, "nft", "-f", "-", "add table ip pmtrace\nadd chain ip pmtrace out { type filter hook output priority -400 ; }\nadd rule ip pmtrace out tcp dport 8080 meta nftrace set 1\n")
	defer exec.Command("nft", "delete", "table", "ip", "pmtrace").Run()

	at1 := traced(t)
	for i := range 999 {
		p := mkPlan("net1", fmt.Sprintf("o%d", i), fmt.Sprintf("192.0.2.%d/24", 3+i%250), 10000+i)
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	at1000 := traced(t)
	t.Logf("rules met by a new connection: %d with 1 attachment, %d with 1000", at1, at1000)
	if at1 == 0 || at1000 != at1 {
		t.Errorf("rules met: %d with 1 attachment, %d with 1000; want the same, non-zero", at1, at1000)
	}
}

// traced opens one connection to 127.0.0.1:8080 and counts the trace events
// of rules in our table.
func traced(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mon := exec.CommandContext(ctx, "nft", "monitor", "trace")
	out, err := mon.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := mon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = mon.Wait() }()
	time.Sleep(300 * time.Millisecond) // let the monitor subscribe
	c, err := net.DialTimeout("tcp", "127.0.0.1:8080", 300*time.Millisecond)
	if err == nil {
		c.Close()
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	id, n := "", 0
	deadline := time.After(2 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return n
			}
			f := strings.Fields(l)
			if len(f) < 6 || f[0] != "trace" || f[3] != "ip" || f[4] != nftables.Table {
				continue
			}
			if id == "" {
				id = f[2] // the first packet's trace
			}
			if f[2] == id && f[6] == "rule" {
				n++
			}
		case <-deadline:
			return n
		}
	}
}

// TestNFTConditionsReadBack: an attachment with conditions (a range,
// and 8 single mappings besides, which are no DNAT map here) is compiled
// by nft, the skeleton with it on a fresh node (the transaction holds
// nft syntax, so nft gets all of it), and nft's encodings of our
// statements read back as what the backend wrote: CHECK passes and a
// pass finds nothing to write, under every nft release the compat
// suite brings. A rule of the attachment's chain that nft is told to
// replace by one matching another protocol, under the same comment, is
// what CHECK names.
func TestNFTConditionsReadBack(t *testing.T) {
	for _, tt := range []struct {
		f    plan.Family
		ip   string
		fam  string
		cond string
	}{{plan.IPv4, "192.0.2.2/24", "ip", "ip daddr != 10.1.0.0/16"}, {plan.IPv6, "2001:db8::2/64", "ip6", "ip6 daddr != 2001:db8:1::/48"}} {
		t.Run(tt.f.String(), func(t *testing.T) {
			nettest.ResetNAT(t)
			b, _ := nftBackend(t, tt.f)
			req := plan.Request{Owner: plan.Owner{Network: "net1", ContainerID: "c1", IfName: "eth0"},
				Masquerade: plan.Masquerade{Enabled: true, MarkBit: 13},
				Mappings: plan.MappingsOf(plan.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP},
					plan.Mapping{HostPort: 20000, ContainerPort: 20000, Protocol: plan.UDP}, plan.Mapping{HostPort: 20001, ContainerPort: 20001, Protocol: plan.UDP}),
				ConditionsV4: []string{tt.cond}, ConditionsV6: []string{tt.cond}}
			for port := 9001; port < 9017; port += 2 { // 8 single mappings more: a rule each
				req.Mappings.Add(plan.Mapping{HostPort: port, ContainerPort: 81, Protocol: plan.TCP})
			}
			n := cidr(tt.ip)
			p := plan.Build(req, tt.f, n)
			if err := b.Apply(p); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			chain := nftables.ChainName(p.Owner)
			if listed := nftTable(t, tt.fam); !strings.Contains(listed, strings.TrimPrefix(tt.cond, tt.fam+" daddr != ")) {
				t.Fatalf("the conditions are not in the table:\n%s", listed)
			}
			if err := b.Check(p); err != nil {
				t.Fatalf("CHECK of what nft compiled: %v", err)
			}
			rep, err := b.Sync([]*plan.Plan{p}, converge.Options{})
			if err != nil || rep.Wrote || len(rep.Shared) > 0 || rep.Results[0].State != converge.OK {
				t.Fatalf("a pass over what nft compiled: wrote %v, shared %q, %+v, %v", rep != nil && rep.Wrote, rep.Shared, rep.Results, err)
			}
			// the 8080 rule, replaced by one for udp under its comment
			out, err := exec.Command("nft", "-a", "list", "chain", tt.fam, nftables.Table, chain).CombinedOutput()
			if err != nil {
				t.Fatalf("nft -a list chain: %v\n%s", err, out)
			}
			var handle string
			for _, l := range strings.Split(string(out), "\n") {
				if strings.Contains(l, `comment "hostport tcp . 8080"`) {
					handle = l[strings.LastIndex(l, " ")+1:]
				}
			}
			if handle == "" {
				t.Fatalf("no rule for tcp . 8080 in:\n%s", out)
			}
			to := "192.0.2.2:80"
			if tt.f == plan.IPv6 {
				to = "[2001:db8::2]:80"
			}
			rule := fmt.Sprintf("%s meta l4proto udp th dport 8080 dnat to %s comment \"hostport tcp . 8080\"", tt.cond, to)
			if out, err := exec.Command("nft", "replace", "rule", tt.fam, nftables.Table, chain, "handle", handle, rule).CombinedOutput(); err != nil {
				t.Fatalf("nft replace rule: %v\n%s", err, out)
			}
			if err := b.Check(p); err == nil || !strings.Contains(err.Error(), "does not meta l4proto tcp") {
				t.Errorf("CHECK of a rule matching udp under the tcp rule's comment: %v", err)
			}
			// a flat attachment beside it, the table gone: one pass
			// writes both again
			q := mkPlan("net1", "c2", tt.ip, 7000)
			if err := b.Apply(q); err != nil {
				t.Fatalf("Apply flat: %v", err)
			}
			if out, err := exec.Command("nft", "delete", "table", tt.fam, nftables.Table).CombinedOutput(); err != nil {
				t.Fatalf("nft delete table: %v\n%s", err, out)
			}
			if rep, err := b.Sync([]*plan.Plan{q, p}, converge.Options{}); err != nil || !rep.Wrote {
				t.Fatalf("a pass after the table went: %+v, %v", rep, err)
			}
			for _, a := range []*plan.Plan{q, p} {
				if err := b.Check(a); err != nil {
					t.Errorf("CHECK %s after the pass: %v", a.Owner.ContainerID, err)
				}
			}
		})
	}
}
