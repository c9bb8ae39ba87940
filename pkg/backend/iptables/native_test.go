package iptables

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/test/fixture"
)

// The x_tables structs the native fast path hands the kernel, as
// iptables-nft 1.8 fills them (the kernel tests compare whole rules with
// iptables-restore's; these name the fields).
func TestNativeStructs(t *testing.T) {
	for _, c := range []struct {
		f          plan.Family
		to, want   string
		wantFailed bool
	}{
		// flags MAP_IPS|PROTO_SPECIFIED, min and max address, ports 80-80,
		// no base; aligned to 48 bytes
		{plan.IPv4, "192.0.2.2:80", host32(3) + "c0000202" + zeros(12) + "c0000202" + zeros(12) + "0050" + "0050" + "0000" + zeros(6), false},
		// an identity range: the address alone
		{plan.IPv4, "192.0.2.2", host32(1) + "c0000202" + zeros(12) + "c0000202" + zeros(12) + zeros(12), false},
		// an offset range: PROTO_OFFSET with the first host port as base
		{plan.IPv4, "192.0.2.2:80-90/8000", host32(0x23) + "c0000202" + zeros(12) + "c0000202" + zeros(12) + "0050" + "005a" + "1f40" + zeros(6), false},
		{plan.IPv6, "[2001:db8::2]:80", host32(3) + "20010db8" + zeros(10) + "0002" + "20010db8" + zeros(10) + "0002" + "0050" + "0050" + "0000" + zeros(6), false},
		{plan.IPv6, "192.0.2.2:80", "", true},
		{plan.IPv4, "192.0.2.2:x", "", true},
	} {
		got, ok := xt.NatRange2(c.f, c.to)
		if ok == c.wantFailed || ok && hex.EncodeToString(got) != c.want {
			t.Errorf("xt.NatRange2(%s, %q) = %x, %v; want %s", c.f, c.to, got, ok, c.want)
		}
	}
	// flags DESTINATION, count 4 (a range takes two), ports in host
	// order, pflags marking where the range starts
	got, ok := xt.MultiportInfo("80,8000:8010,90")
	want := "0104" + host16(80) + host16(8000) + host16(8010) + host16(90) + zeros(22) + "00010000" + zeros(11) + "00"
	if !ok || hex.EncodeToString(got) != want {
		t.Errorf("MultiportInfo = %x, want %s", got, want)
	}
	if _, ok := xt.MultiportInfo("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15:16"); ok {
		t.Error("MultiportInfo took 16 slots")
	}
}

// host32 and host16 are v in the machine's byte order, as hex: the
// x_tables structs hold their flags and ports so.
func host32(v uint32) string { return hex.EncodeToString(binary.NativeEndian.AppendUint32(nil, v)) }
func host16(v uint16) string { return hex.EncodeToString(binary.NativeEndian.AppendUint16(nil, v)) }

func zeros(n int) string {
	b := make([]byte, 2*n)
	for i := range b {
		b[i] = '0'
	}
	return string(b)
}

// TestNativeRefuses: rules the native path does not write are left to
// iptables-restore, whole: conditions, SCTP, a jump to a chain it was not
// told of, a target it does not know.
func TestNativeRefuses(t *testing.T) {
	chains := map[string]bool{SetMarkChain: true}
	for _, r := range []xt.Rule{
		{Proto: plan.TCP, Dport: "80", Matches: []string{"!", "-s", "10.0.0.0/8"}, Jump: SetMarkChain},
		{Proto: plan.SCTP, Dport: "80", Jump: SetMarkChain},
		{Proto: plan.TCP, Dport: "80", Jump: "KUBE-MARK-MASQ"},
		{Proto: plan.TCP, Dport: "80", Jump: "MASQUERADE"},
		{Proto: plan.TCP, Dport: "80"},
		{Dport: "80", Jump: SetMarkChain},
		{Comment: "x", Proto: plan.TCP, Dports: "80", Matches: []string{"-m", "mark", "--mark", "1"}, Jump: SetMarkChain},
	} {
		r.Chain = "X"
		if _, _, _, err := xt.EncodeRule(plan.IPv4, r, chains); !errors.Is(err, xt.ErrNotNative) {
			t.Errorf("xt.EncodeRule(%q): %v, want xt.ErrNotNative", r.Args(), err)
		}
	}
	if _, _, _, err := xt.EncodeRule(plan.IPv4, xt.Rule{Chain: "X", Proto: plan.UDP, Dport: "53", Src: "10.0.0.0/8", Jump: SetMarkChain}, chains); err != nil {
		t.Errorf("EncodeRule of a hairpin rule: %v", err)
	}
}

// TestSameRulesAsTheKernelDumps: CHECK's comparison takes the kernel's
// dump of rules iptables-restore wrote (testdata: iptables 1.8.7 on Linux
// 6.18, the dump's order of attributes, no nested flags) for the rules we
// write, whatever their counters say, and nothing else: another port,
// address, target or comment, a rule missing, an attribute more.
func TestSameRulesAsTheKernelDumps(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the dump is a little-endian machine's: its attribute headers and x_tables structs are in that byte order")
	}
	b, err := os.ReadFile("testdata/kernel-dump-rules.hex")
	if err != nil {
		t.Fatal(err)
	}
	var dumped [][]byte
	for _, l := range strings.Fields(string(b)) {
		d, err := hex.DecodeString(l)
		if err != nil {
			t.Fatal(err)
		}
		dumped = append(dumped, d)
	}
	const dn = "CNI-DN-4cbb58d4f7a53f51ff607"
	chains := map[string]bool{SetMarkChain: true, dn: true}
	rules := []xt.Rule{
		{Proto: plan.TCP, Dport: "8000:8010", Dst: "192.0.2.1", Src: "10.0.0.0/20", Jump: SetMarkChain},
		{Proto: plan.UDP, Dport: "8000:8010", Jump: "DNAT", To: "10.1.0.3"},
		{Proto: plan.TCP, Dport: "8000:8010", Jump: "DNAT", To: "10.1.0.3:80-90/8000"},
		{Comment: `dnat name: "bench" id: "c1"`, Proto: plan.TCP, Dports: "10001", Jump: dn},
	}
	if same, err := xt.SameRules(plan.IPv4, dumped, rules, chains, false); !same || err != nil {
		t.Fatalf("the kernel's dump of the rules: same %v, %v", same, err)
	}
	// a counter that counted: still the same rule
	counted := bytes.Replace(dumped[0], []byte("counter\x00\x1c\x00\x02\x00\x0c\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
		[]byte("counter\x00\x1c\x00\x02\x00\x0c\x00\x01\x00\x00\x00\x00\x00\x00\x00\x30\x39"), 1)
	if bytes.Equal(counted, dumped[0]) {
		t.Fatal("no counter to change in the dump")
	}
	if same, _ := xt.SameRules(plan.IPv4, [][]byte{counted}, rules[:1], chains, false); !same {
		t.Error("a rule whose counter counted is not the same")
	}
	for i, change := range []func(r []xt.Rule){
		func(r []xt.Rule) { r[0].Dport = "8000:8011" },
		func(r []xt.Rule) { r[0].Src = "10.0.0.0/21" },
		func(r []xt.Rule) { r[0].Dst = "192.0.2.2" },
		func(r []xt.Rule) { r[1].To = "10.1.0.4" },
		func(r []xt.Rule) { r[2].To = "10.1.0.3:80-90/8001" },
		func(r []xt.Rule) { r[3].Comment = `dnat name: "bench" id: "c2"` },
		func(r []xt.Rule) { r[3].Dports = "10001,10002" },
		func(r []xt.Rule) { r[3].Jump = SetMarkChain },
	} {
		c := slices.Clone(rules)
		change(c)
		if same, err := xt.SameRules(plan.IPv4, dumped, c, chains, false); same || err != nil {
			t.Errorf("change %d (%v): same %v, %v", i, c, same, err)
		}
	}
	if same, _ := xt.SameRules(plan.IPv4, dumped[:3], rules, chains, false); same {
		t.Error("a rule missing: same")
	}
	// in another order: the same set (entry rules), not the same chain
	reversed := slices.Clone(dumped)
	slices.Reverse(reversed)
	if same, _ := xt.SameRules(plan.IPv4, reversed, rules, chains, true); !same {
		t.Error("in another order, any order: not the same")
	}
	if same, _ := xt.SameRules(plan.IPv4, reversed, rules, chains, false); same {
		t.Error("in another order, in order: same")
	}
	if same, _ := xt.SameRules(plan.IPv4, append(reversed[:3:3], reversed[2]), rules, chains, true); same {
		t.Error("one rule twice, another missing, any order: same")
	}
	// an attribute the rules we write do not have
	extra := slices.Clone(dumped[1])
	var tail nfnl.Attrs
	tail.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
		a.String(unix.NFTA_EXPR_NAME, "meta")
		a.Nested(unix.NFTA_EXPR_DATA, func(a *nfnl.Attrs) { a.U32(unix.NFTA_META_KEY, unix.NFT_META_MARK).U32(unix.NFTA_META_DREG, 1) })
	})
	if same, _ := xt.SameRules(plan.IPv4, [][]byte{append(extra, tail.Bytes()...)}, rules[1:2], chains, false); same {
		t.Error("an expression more: same")
	}
}

// refusing is a kernel that refuses the native path's batch with errno.
type refusing struct {
	xt.Kernel
	errno unix.Errno
}

func (r refusing) AddChain(string, string, []xt.Rule, []xt.Rule, ...string) error {
	return &nfnl.Error{Errno: r.errno}
}

// TestNativeRefusedByTheKernel: where the kernel refuses the native
// path's batch (EINVAL, EOPNOTSUPP: an expression or revision it takes
// otherwise), ADD's fast path is iptables-restore's, which writes what
// the kernel has; a missing xt revision (nft_compat answers ENOENT) or
// a chain already there (EEXIST) takes the slow path; both make the
// attachment, which passes CHECK. Permission refused is an error: the
// tool would be refused too.
func TestNativeRefusedByTheKernel(t *testing.T) {
	for _, tt := range []struct {
		errno    unix.Errno
		restores int // more than the first attachment's
		fails    bool
	}{
		{unix.EINVAL, 1, false},
		{unix.EOPNOTSUPP, 1, false},
		{unix.ENOENT, 1, false}, // the slow path's one restore
		{unix.EEXIST, 1, false},
		{unix.EPERM, 0, true},
		{unix.EACCES, 0, true},
	} {
		t.Run(tt.errno.Error(), func(t *testing.T) {
			b, m := memBackend()
			first, second := fixture.Attachment("a", "192.0.2.2/24", 8080), fixture.Attachment("b", "192.0.2.3/24", 8081)
			if err := b.Apply(first); err != nil {
				t.Fatal(err)
			}
			b.Kernel = refusing{b.Kernel, tt.errno}
			restores := m.Restores
			err := b.Apply(second)
			if tt.fails {
				if !errors.Is(err, tt.errno) || m.Restores != restores {
					t.Errorf("ADD: %v after %d restores, want the kernel's %v and no restore", err, m.Restores-restores, tt.errno)
				}
				return
			}
			if err != nil {
				t.Fatalf("ADD where the kernel refuses the native batch with %v: %v", tt.errno, err)
			}
			if m.Restores != restores+tt.restores {
				t.Errorf("ADD ran %d restores, want %d", m.Restores-restores, tt.restores)
			}
			if err := b.Check(second); err != nil {
				t.Errorf("CHECK: %v", err)
			}
		})
	}
}
