package xttest

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// native writes every rule but one with a MARK target, as exprs of its
// tokens.
func native(chain string, args, _ []string) ([]byte, error) {
	if xt.JumpOf(args) == "MARK" {
		return nil, xt.ErrNotNative
	}
	return []byte(chain + " " + strings.Join(args, " ")), nil
}

// A payload is applied whole or not at all; each refusal is
// iptables-restore's "line N failed", a refused one.
func TestRestoreAllOrNothing(t *testing.T) {
	m := New(native)
	k := m.Kernel(xt.NAT)
	if err := k.Restore([]byte("*nat\n-N A\n-A A -p tcp -j DNAT --to-destination 192.0.2.2\n-A PREROUTING -j A\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	before, _ := k.ListTable()
	for _, tt := range []struct {
		name, payload, line string
	}{
		{"a chain that exists", "-N B\n-N A", "line 3"},
		{"a rule that is not there", "-N B\n-D A -p udp -j DNAT", "line 3"},
		{"a jump to nowhere", "-N B\n-A PREROUTING -j C", "line 3"},
		{"a chain still referenced", "-N B\n-F A\n-X A", "line 4"},
		{"a built-in chain", "-N B\n-X PREROUTING", "line 3"},
		{"a check of a missing rule", "-N B\n-C A -j ACCEPT", "line 3"},
	} {
		err := k.Restore([]byte("*nat\n" + tt.payload + "\nCOMMIT\n"))
		var re *xt.RestoreError
		if !errors.As(err, &re) || !re.Refused || !strings.Contains(re.Output, tt.line+" failed") {
			t.Errorf("%s: %v, want %s refused", tt.name, err, tt.line)
		}
		if after, _ := k.ListTable(); !slices.Equal(after, before) {
			t.Errorf("%s: the table changed:\n%q", tt.name, after)
		}
	}
	if m.Restores != 1 {
		t.Errorf("%d restores committed, want 1", m.Restores)
	}
	want := []string{"-P PREROUTING ACCEPT", "-P INPUT ACCEPT", "-P OUTPUT ACCEPT", "-P POSTROUTING ACCEPT", "-N A",
		"-A PREROUTING -j A", "-A A -p tcp -j DNAT --to-destination 192.0.2.2"}
	if !slices.Equal(before, want) {
		t.Errorf("iptables -S: %q, want %q", before, want)
	}
}

// The native path takes what the native writer writes, in one step; the
// summary reads the rules back as nf_tables netlink would; Unlink takes a
// chain and the parent's jumps to it; a legacy table is out of reach.
func TestNativePathAndSummary(t *testing.T) {
	m := New(native)
	k := m.Kernel(xt.NAT)
	entry := xt.Rule{Chain: "PREROUTING", Proto: "tcp", Dport: "8080", Jump: "DN-1", Insert: true}
	dnat := xt.Rule{Chain: "DN-1", Proto: "tcp", Jump: "DNAT", To: "192.0.2.2:80"}
	if err := k.AddChain("", "DN-1", []xt.Rule{dnat}, []xt.Rule{entry}); err != nil {
		t.Fatal(err)
	}
	if err := k.AddChain("", "DN-1", []xt.Rule{dnat}, nil); err == nil {
		t.Error("AddChain of a chain that exists passed")
	}
	if err := k.AddChain("", "DN-2", []xt.Rule{{Chain: "DN-2", Jump: "MARK", SetXmark: "0x1/0x1"}}, nil); !errors.Is(err, xt.ErrNotNative) {
		t.Errorf("AddChain of a rule not written natively: %v", err)
	}
	if err := k.AddChain("WITNESS", "DN-3", nil, nil); err == nil {
		t.Error("AddChain with a missing marker passed")
	}
	if m.Natives != 1 {
		t.Errorf("%d native writes, want 1", m.Natives)
	}
	s, err := k.Chains(xt.NAT, []string{"PREROUTING", "DN-1", "DN-2"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 2 || s["PREROUTING"].Rules != 1 || !slices.Equal(s["PREROUTING"].Jumps, []string{"DN-1"}) || s["DN-1"].Refs != 1 ||
		string(s["DN-1"].Exprs[0]) != "DN-1 -p tcp -j DNAT --to-destination 192.0.2.2:80" {
		t.Errorf("summary: %+v", s)
	}
	if err := k.EnsureChain(xt.Chain{Name: "OTHER"}); err != nil {
		t.Fatal(err)
	}
	if err := k.EnsureRule(xt.Rule{Chain: "OTHER", Jump: "DN-1"}); err != nil {
		t.Fatal(err)
	}
	if found, err := k.Unlink("PREROUTING", "DN-1"); !found || !errors.Is(err, unix.EBUSY) {
		t.Errorf("Unlink of a chain another chain jumps to: %t, %v; want EBUSY", found, err)
	}
	if err := k.Restore([]byte("*nat\n-D OTHER -j DN-1\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if found, err := k.Unlink("PREROUTING", "DN-1"); !found || err != nil {
		t.Errorf("Unlink: %t, %v", found, err)
	}
	if lines, _ := k.ListTable(); slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "DN-1") }) {
		t.Errorf("after Unlink: %q", lines)
	}
	m.Legacy = true
	if _, err := k.Chains(xt.NAT, []string{"OTHER"}, false); !errors.Is(err, xt.ErrLegacy) {
		t.Errorf("Chains of a legacy table: %v", err)
	}
	if err := k.Writable(); !errors.Is(err, nfnl.ErrNoProbe) {
		t.Errorf("Writable of a legacy table: %v", err)
	}
	m.Flush()
	if lines, _ := k.ListTable(); len(lines) != 4 {
		t.Errorf("after Flush: %q, want the policies alone", lines)
	}
}

// TestTrace: a packet runs PREROUTING (or OUTPUT), the jumps, MARK and
// DNAT, then POSTROUTING with its mark; what the tracer does not know
// fails it, named.
func TestTrace(t *testing.T) {
	m := New(native)
	if err := m.Kernel(xt.NAT).Restore([]byte(`*nat
-N HOSTPORTS
-N DN-1
-A PREROUTING -m addrtype --dst-type LOCAL -j HOSTPORTS
-A OUTPUT -d 127.0.0.1 -j HOSTPORTS
-A HOSTPORTS -p tcp -m multiport --destination-ports 8080,9000:9010 -j DN-1
-A HOSTPORTS -p tcp --dport 6666 -j DROP
-A HOSTPORTS -p tcp --dport 7777 -m conntrack --ctstate NEW -j ACCEPT
-A DN-1 -s 192.0.2.0/24 -p tcp -j MARK --set-xmark 0x2000/0x2000
-A DN-1 ! -s 10.0.0.0/8 -p tcp --dport 8080 -j DNAT --to-destination 192.0.2.2:80
-A DN-1 -p tcp -j DNAT --to-destination 192.0.2.2:10000-10010/9000
-A POSTROUTING -m mark --mark 0x2000/0x2000 -j MASQUERADE
COMMIT
`)); err != nil {
		t.Fatal(err)
	}
	ip := func(s string) net.IP { return net.ParseIP(s).To4() }
	local := func(a net.IP) bool { return a.Equal(ip("198.51.100.1")) }
	for _, tt := range []struct {
		name   string
		p      plan.Packet
		want   Verdict
		failed string
	}{
		{"a host port", plan.Packet{Protocol: "tcp", Src: ip("203.0.113.9"), Dst: ip("198.51.100.1"), Dport: 8080},
			Verdict{Chains: []string{"HOSTPORTS", "DN-1"}, DNAT: "192.0.2.2:80"}, ""},
		{"hairpin: marked, masqueraded", plan.Packet{Protocol: "tcp", Src: ip("192.0.2.2"), Dst: ip("198.51.100.1"), Dport: 8080},
			Verdict{Chains: []string{"HOSTPORTS", "DN-1"}, DNAT: "192.0.2.2:80", Masquerade: true}, ""},
		{"a negated source: not this rule", plan.Packet{Protocol: "tcp", Src: ip("10.1.1.1"), Dst: ip("198.51.100.1"), Dport: 8080},
			Verdict{Chains: []string{"HOSTPORTS", "DN-1"}, DNAT: "192.0.2.2:9080"}, ""}, // the next rule: 10000 + 8080 - 9000
		{"a shifted range", plan.Packet{Protocol: "tcp", Src: ip("203.0.113.9"), Dst: ip("198.51.100.1"), Dport: 9005},
			Verdict{Chains: []string{"HOSTPORTS", "DN-1"}, DNAT: "192.0.2.2:10005"}, ""},
		{"not a local address", plan.Packet{Protocol: "tcp", Src: ip("203.0.113.9"), Dst: ip("192.0.2.9"), Dport: 8080}, Verdict{}, ""},
		{"the host to localhost", plan.Packet{Protocol: "tcp", Src: ip("127.0.0.1"), Dst: ip("127.0.0.1"), Dport: 8080, FromHost: true},
			Verdict{Chains: []string{"HOSTPORTS", "DN-1"}, DNAT: "192.0.2.2:80"}, ""},
		{"dropped", plan.Packet{Protocol: "tcp", Src: ip("203.0.113.9"), Dst: ip("198.51.100.1"), Dport: 6666},
			Verdict{Chains: []string{"HOSTPORTS"}, Dropped: true}, ""},
		{"a match it does not know", plan.Packet{Protocol: "tcp", Src: ip("203.0.113.9"), Dst: ip("198.51.100.1"), Dport: 7777}, Verdict{}, "--ctstate"},
	} {
		v, err := m.Trace(tt.p, local)
		if tt.failed != "" {
			if err == nil || !strings.Contains(err.Error(), tt.failed) {
				t.Errorf("%s: %+v, %v; want it to fail naming %q", tt.name, v, err, tt.failed)
			}
			continue
		}
		if err != nil || !slices.Equal(v.Chains, tt.want.Chains) || v.DNAT != tt.want.DNAT || v.Masquerade != tt.want.Masquerade || v.Dropped != tt.want.Dropped {
			t.Errorf("%s: %+v, %v; want %+v", tt.name, v, err, tt.want)
		}
	}
}
