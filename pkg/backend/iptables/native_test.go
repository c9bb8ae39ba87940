package iptables

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
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
		{plan.IPv4, "192.0.2.2:80", "03000000" + "c0000202" + zeros(12) + "c0000202" + zeros(12) + "0050" + "0050" + "0000" + zeros(6), false},
		// an identity range: the address alone
		{plan.IPv4, "192.0.2.2", "01000000" + "c0000202" + zeros(12) + "c0000202" + zeros(12) + zeros(12), false},
		// an offset range: PROTO_OFFSET with the first host port as base
		{plan.IPv4, "192.0.2.2:80-90/8000", "23000000" + "c0000202" + zeros(12) + "c0000202" + zeros(12) + "0050" + "005a" + "1f40" + zeros(6), false},
		{plan.IPv6, "[2001:db8::2]:80", "03000000" + "20010db8" + zeros(10) + "0002" + "20010db8" + zeros(10) + "0002" + "0050" + "0050" + "0000" + zeros(6), false},
		{plan.IPv6, "192.0.2.2:80", "", true},
		{plan.IPv4, "192.0.2.2:x", "", true},
	} {
		got, ok := natRange2(c.f, c.to)
		if ok == c.wantFailed || ok && hex.EncodeToString(got) != c.want {
			t.Errorf("natRange2(%s, %q) = %x, %v; want %s", c.f, c.to, got, ok, c.want)
		}
	}
	// flags DESTINATION, count 4 (a range takes two), ports in host
	// order, pflags marking where the range starts
	got, ok := multiportInfo("80,8000:8010,90")
	want := "0104" + "5000" + "401f" + "4a1f" + "5a00" + zeros(22) + "00010000" + zeros(11) + "00"
	if !ok || hex.EncodeToString(got) != want {
		t.Errorf("multiportInfo = %x, want %s", got, want)
	}
	if _, ok := multiportInfo("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15:16"); ok {
		t.Error("multiportInfo took 16 slots")
	}
}

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
	for _, args := range [][]string{
		{"-p", "tcp", "--dport", "80", "!", "-s", "10.0.0.0/8", "-j", SetMarkChain},
		{"-p", "sctp", "--dport", "80", "-j", SetMarkChain},
		{"-p", "tcp", "--dport", "80", "-j", "KUBE-MARK-MASQ"},
		{"-p", "tcp", "--dport", "80", "-j", "MASQUERADE"},
		{"-p", "tcp", "--dport", "80"},
		{"--dport", "80", "-j", SetMarkChain},
		{"-m", "comment", "--comment", "x", "-m", "multiport", "-p", "tcp", "--destination-ports", "80", "-m", "mark", "--mark", "1", "-j", SetMarkChain},
	} {
		if _, _, _, err := encodeRule(plan.IPv4, Rule{Chain: "X", Args: args}, chains); !errors.Is(err, errNotNative) {
			t.Errorf("encodeRule(%q): %v, want errNotNative", args, err)
		}
	}
	if _, _, _, err := encodeRule(plan.IPv4, Rule{Chain: "X", Args: []string{"-p", "udp", "--dport", "53", "-s", "10.0.0.0/8", "-j", SetMarkChain}}, chains); err != nil {
		t.Errorf("encodeRule of a hairpin rule: %v", err)
	}
}
