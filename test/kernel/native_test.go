package kernel

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/test/nettest"
)

// viaRestore is the real kernel seam with the native fast path refused
// as on iptables-legacy: ADD's fast path is then the iptables-restore of
// earlier releases.
type viaRestore struct{ xt.Kernel }

func (viaRestore) AddChain(string, string, []xt.Rule, []xt.Rule, ...string) error {
	return xt.ErrLegacy
}

// ruleExprs dumps chain of the nat table of family f over nf_tables
// netlink: each rule's expressions as the kernel holds them (what
// iptables -S and iptables-save parse), without its handle and position.
func ruleExprs(t *testing.T, f plan.Family, chain string) [][]byte {
	t.Helper()
	c, err := nfnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fam := uint8(unix.NFPROTO_IPV4)
	if f == plan.IPv6 {
		fam = unix.NFPROTO_IPV6
	}
	var a nfnl.Attrs
	a.String(unix.NFTA_RULE_TABLE, iptables.Table).String(unix.NFTA_RULE_CHAIN, chain)
	rules, err := c.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETRULE), Family: fam, Attrs: a.Bytes()})
	if err != nil {
		t.Fatalf("dump %s: %v", chain, err)
	}
	var out [][]byte
	for _, r := range rules {
		e, _ := nfnl.Find(r.Attrs, unix.NFTA_RULE_EXPRESSIONS)
		out = append(out, e)
	}
	return out
}

var saveNoise = regexp.MustCompile(`(?m)^#.*\n|\[\d+:\d+\]`)

// TestNativeAddAsRestore: ADD's native fast path writes what
// iptables-restore writes for the same plan — the same rules in the same
// order as iptables-save prints them, and byte for byte the same
// expressions as the kernel holds them — for every kind of rule it
// writes, in both families; iptables deletes its entry rules by rule
// (as upstream's DEL does) and DEL leaves nothing. Plans with rules it
// does not write (conditions, SCTP) go to iptables-restore.
func TestNativeAddAsRestore(t *testing.T) {
	mk := func(f plan.Family, addr string, edit func(*plan.Request), ms ...plan.Mapping) *plan.Plan {
		req := plan.Request{
			Owner:      plan.Owner{Network: "net1", ContainerID: "native", IfName: "eth0"},
			Masquerade: plan.Masquerade{Enabled: true, MarkBit: 13},
		}
		for _, m := range ms {
			req.Mappings.Add(m)
		}
		if edit != nil {
			edit(&req)
		}
		return plan.Build(req, f, cidr(addr))
	}
	tcp := func(host, ctr int) plan.Mapping {
		return plan.Mapping{HostPort: host, ContainerPort: ctr, Protocol: plan.TCP}
	}
	udp := func(host, ctr int) plan.Mapping {
		return plan.Mapping{HostPort: host, ContainerPort: ctr, Protocol: plan.UDP}
	}
	span := func(proto plan.Protocol, host, ctr, n int) []plan.Mapping {
		var out []plan.Mapping
		for i := range n {
			out = append(out, plan.Mapping{HostPort: host + i, ContainerPort: ctr + i, Protocol: proto})
		}
		return out
	}
	withIP := func(m plan.Mapping, ip string) plan.Mapping { m.HostIP = net.ParseIP(ip); return m }
	many := func() []plan.Mapping {
		var out []plan.Mapping
		for i := range 20 {
			out = append(out, tcp(9000+3*i, 80))
		}
		return out
	}
	// guest: the case writes an expression, an address or a port form no
	// other guest case writes, so Debian's kernels in the guests (make
	// guest-test) store and dump it too; the other cases differ from
	// these in which rules they write, not in how, or write in one case
	// what two of the guest's write together, and the guests (where the
	// test takes some 20 times the host's time under the emulator: each
	// case runs thirty or so processes) leave them to the host's kernel.
	cases := []struct {
		name          string
		p             *plan.Plan
		native, guest bool
	}{
		{"one tcp", mk(plan.IPv4, "192.0.2.2/24", nil, tcp(8080, 80)), true, false},
		{"tcp and udp, host IP", mk(plan.IPv4, "192.0.2.2/24", nil, tcp(8080, 80), withIP(udp(5353, 53), "198.51.100.7")), true, false},
		{"prefix off a byte", mk(plan.IPv4, "10.20.30.40/20", nil, tcp(8080, 80)), true, false},
		{"host IP, prefix off a byte", mk(plan.IPv4, "10.20.30.40/20", nil, tcp(8080, 80), withIP(udp(5353, 53), "198.51.100.7")), true, true},
		{"identity range", mk(plan.IPv4, "192.0.2.2/24", nil, span(plan.TCP, 8000, 8000, 11)...), true, false},
		{"offset range", mk(plan.IPv4, "192.0.2.2/24", nil, span(plan.UDP, 8000, 9000, 11)...), true, false},
		{"identity and offset ranges", mk(plan.IPv4, "192.0.2.2/24", nil, append(span(plan.TCP, 8000, 8000, 11), span(plan.UDP, 8000, 9000, 11)...)...), true, true},
		{"more than 15 multiport slots", mk(plan.IPv4, "192.0.2.2/24", nil, append(many(), span(plan.TCP, 7000, 7000, 5)...)...), true, true},
		{"masqAll", mk(plan.IPv4, "192.0.2.2/24", func(r *plan.Request) { r.Masquerade.All = true }, tcp(8080, 80)), true, false},
		{"snat off", mk(plan.IPv4, "192.0.2.2/24", func(r *plan.Request) { r.Masquerade.Enabled = false }, tcp(8080, 80), udp(8080, 80)), true, false},
		{"IPv6", mk(plan.IPv6, "2001:db8::2/64", nil, tcp(8080, 80), withIP(udp(5353, 53), "2001:db8:1::7")), true, true},
		{"IPv6 ranges", mk(plan.IPv6, "2001:db8::2/64", nil, append(span(plan.TCP, 8000, 8000, 4), span(plan.UDP, 8000, 9000, 4)...)...), true, true},
		{"IPv6 masqAll", mk(plan.IPv6, "2001:db8::2/64", func(r *plan.Request) { r.Masquerade.All = true }, tcp(8080, 80)), true, false},
		{"conditions", mk(plan.IPv4, "192.0.2.2/24", func(r *plan.Request) { r.ConditionsV4 = []string{"!", "-s", "198.51.100.0/24"} }, tcp(8080, 80)), false, true},
		{"sctp", mk(plan.IPv4, "192.0.2.2/24", nil, plan.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: plan.SCTP}), false, false},
	}
	inGuest := os.Getenv("PORTMAP_GUEST") != ""
	for _, tc := range cases {
		if inGuest && !tc.guest {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			f, p := tc.p.Family, tc.p
			fam := int(f)
			chain := iptables.ChainName(p.Owner)
			// the node's skeleton, made by another attachment's ADD
			other := mk(f, map[plan.Family]string{plan.IPv4: "192.0.2.9/24", plan.IPv6: "2001:db8::9/64"}[f], nil, tcp(7777, 80))
			other.Owner.ContainerID = "other"
			other.Masquerade = p.Masquerade
			other.Masquerade.All = false
			write := func(native bool) (save string, dn, entries [][]byte, c *counting) {
				nettest.ResetNAT(t)
				b, c := backend(t, f)
				if err := b.Apply(other); err != nil {
					t.Fatalf("ADD of the skeleton's attachment: %v", err)
				}
				if !native {
					c.Kernel = viaRestore{c.Kernel}
				}
				*c = counting{Kernel: c.Kernel}
				if err := b.Apply(p); err != nil {
					t.Fatalf("ADD (native %v): %v", native, err)
				}
				return saveNoise.ReplaceAllString(nettest.Save(t, fam), ""), ruleExprs(t, f, chain), ruleExprs(t, f, iptables.TopLevelDNATChain), c
			}
			wantSave, wantDN, wantEntries, rc := write(false)
			if rc.restores != 1 {
				t.Fatalf("ADD through iptables-restore ran %d restores", rc.restores)
			}
			save, dn, entries, c := write(true)
			if tc.native && (c.natives != 1 || c.restores != 0) {
				t.Fatalf("ADD: %d native transactions, %d restores; want the native one alone", c.natives, c.restores)
			}
			if !tc.native && c.restores != 1 {
				t.Fatalf("ADD of rules the native path does not write: %d restores, want 1", c.restores)
			}
			if save != wantSave {
				t.Errorf("iptables-save after the native ADD:\n%s\nafter iptables-restore:\n%s", save, wantSave)
			}
			same := func(what string, got, want [][]byte) {
				if len(got) != len(want) {
					t.Errorf("%s: %d rules, iptables-restore's %d", what, len(got), len(want))
					return
				}
				for i := range got {
					if !bytes.Equal(got[i], want[i]) {
						t.Errorf("%s, rule %d: expressions\n%x\niptables-restore's\n%x", what, i, got[i], want[i])
					}
				}
			}
			tool := map[plan.Family]string{plan.IPv4: "iptables", plan.IPv6: "ip6tables"}[f]
			release, _ := nettest.IptablesRelease(t)
			if release == xt.NativeRelease {
				same(chain, dn, wantDN)
				same(iptables.TopLevelDNATChain, entries, wantEntries)
			} else {
				// a later release writes some matches its own way, and
				// reads ours as the rules it would have written: -C
				// finds each by its spec
				for _, c := range []string{chain, iptables.TopLevelDNATChain} {
					for _, l := range strings.Split(nettest.Run(t, tool, "-t", "nat", "-S", c), "\n") {
						if rule, ok := strings.CutPrefix(l, "-A "); ok {
							nettest.Run(t, tool, append([]string{"-t", "nat", "-C"}, xt.SplitRule(rule)...)...)
						}
					}
				}
			}

			b, bc := backend(t, f)
			if err := b.Check(p); err != nil {
				t.Errorf("CHECK after the native ADD: %v", err)
			}
			// it finds the chain's rules as it writes them, without a
			// listing (conditions are in the entry rules alone, which a
			// restore's -C checks; the chain iptables-restore wrote reads
			// as the native one whatever the release: 1.8.7 writes a port
			// as the native writer does, 1.8.8 and later as a payload
			// match, which compares equal); rules it does not write,
			// iptables lists
			nativeChain := tc.native || len(p.Conditions) > 0
			if lists := bc.chainLists + bc.lists; nativeChain && lists != 0 || !nativeChain && lists != 1 {
				t.Errorf("CHECK listed %d times", lists)
			}
			// iptables takes the rules for its own: it deletes an entry
			// rule by its spec, as upstream's DEL does
			e := iptables.EntryRules(p)[0]
			nettest.Run(t, tool, append([]string{"-t", "nat", "-D", e.Chain}, e.Args()...)...)
			if err := b.Remove(p); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if s := nettest.Save(t, fam); strings.Contains(s, chain) {
				t.Errorf("DEL left the attachment:\n%s", s)
			}
		})
	}
}

// TestNativeAddRefusals: the native fast path fails as the restore did
// when the node is not as it assumes — the attachment's chain exists (a
// re-ADD), the marker is gone — and the slow path then makes the
// attachment; nothing of a refused transaction stays.
func TestNativeAddRefusals(t *testing.T) {
	nettest.ResetNAT(t)
	b, c := backend(t, plan.IPv4)
	a := mkPlan("net1", "a", "192.0.2.2/24", 8080)
	if err := b.Apply(a); err != nil {
		t.Fatal(err)
	}
	w, _ := iptables.Marker(a)
	bp := mkPlan("net1", "b", "192.0.2.3/24", 8081)
	for _, step := range []struct {
		name string
		prep func()
		want error
	}{
		{"re-ADD", func() {}, unix.EEXIST},
		{"no marker", func() { nettest.Run(t, "iptables", "-t", "nat", "-X", w.Name) }, unix.ENOENT},
	} {
		step.prep()
		p := a
		if step.want == unix.ENOENT {
			p = bp
		}
		before := saveNoise.ReplaceAllString(nettest.Save(t, 4), "")
		err := c.Kernel.AddChain(w.Name, iptables.ChainName(p.Owner), iptables.ChainRules(p), iptables.EntryRules(p), iptables.SetMarkChain)
		if !errors.Is(err, step.want) || !iptables.Missed(err) {
			t.Errorf("%s: native ADD: %v, want %v as a refusal", step.name, err, step.want)
		}
		if after := saveNoise.ReplaceAllString(nettest.Save(t, 4), ""); after != before {
			t.Errorf("%s: the refused transaction changed the table:\n%s", step.name, after)
		}
		if err := b.Apply(p); err != nil {
			t.Fatalf("%s: ADD: %v", step.name, err)
		}
		if err := b.Check(p); err != nil {
			t.Errorf("%s: CHECK after the slow path: %v", step.name, err)
		}
	}
	if s := nettest.Save(t, 4); strings.Count(s, fmt.Sprintf("-j %s", iptables.ChainName(a.Owner))) != 1 {
		t.Errorf("re-ADD left a second entry rule:\n%s", s)
	}
}

// TestNativeAddBehindAWrapper: a restore tool that is a wrapper around
// iptables-nft (as the bench's counting shims are) does not send ADD to
// iptables-restore: the native path follows where the shared rules were
// read, nf_tables.
func TestNativeAddBehindAWrapper(t *testing.T) {
	nettest.ResetNAT(t)
	dir := t.TempDir()
	real, err := exec.LookPath("iptables-restore")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "iptables-restore"), []byte("#!/bin/sh\nexec "+real+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	b, c := backend(t, plan.IPv4)
	if err := b.Apply(mkPlan("net1", "a", "192.0.2.2/24", 8080)); err != nil {
		t.Fatal(err)
	}
	*c = counting{Kernel: c.Kernel}
	p := mkPlan("net1", "b", "192.0.2.3/24", 8081)
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	if c.natives != 1 || c.restores != 0 {
		t.Errorf("ADD behind a wrapper: %d native transactions, %d restores; want 1, 0", c.natives, c.restores)
	}
	if err := b.Check(p); err != nil {
		t.Errorf("CHECK: %v", err)
	}
}
