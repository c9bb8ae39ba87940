package nfttest_test

import (
	"net"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
)

// vmap looks meta l4proto . th dport up in verdict map "ports".
type vmap struct{}

func (vmap) Text(nft.Family) string { return "meta l4proto . th dport vmap @ports" }
func (vmap) Encode(e *nft.Exprs) {
	e.Meta(unix.NFT_META_L4PROTO, nft.Reg1)
	e.Payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, nft.Reg32+1)
	e.Add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, "ports")
		a.U32(unix.NFTA_LOOKUP_SREG, nft.Reg1)
		a.U32(unix.NFTA_LOOKUP_DREG, nft.RegVerdict)
	})
}

// drop is a verdict; ct an expression the tracer does not know.
type (
	drop struct{}
	ct   struct{}
)

func (drop) Text(nft.Family) string { return "drop" }
func (drop) Encode(e *nft.Exprs)    { e.Verdict(0, "") }
func (ct) Text(nft.Family) string   { return "ct state established" }
func (ct) Encode(e *nft.Exprs) {
	e.Add("ct", func(a *nfnl.Attrs) { a.U32(unix.NFTA_CT_KEY, unix.NFT_CT_STATE); a.U32(unix.NFTA_CT_DREG, nft.Reg1) })
}

// TestTraceAndRuleset: Ruleset prints the objects as held; a packet runs
// the nat base chains by priority, through a fib check, a verdict map's
// goto, ports and port ranges, a mark its postrouting masquerade reads,
// and a drop; what the tracer does not know fails it naming the
// expression.
func TestTraceAndRuleset(t *testing.T) {
	k := nfttest.New()
	ports := &nft.Set{Name: "ports", Key: key, Data: []nft.Type{nft.Verdict}}
	elem := func(port int, chain string) *nft.Element {
		return &nft.Element{Set: ports, Key: []byte{unix.IPPROTO_TCP, 0, 0, 0, byte(port >> 8), byte(port), 0, 0}, Goto: chain}
	}
	base := func(name, hook string, num uint32, prio int32) *nft.Chain {
		return &nft.Chain{Name: name, Base: &nft.BaseChain{Type: "nat", Hook: hook, HookNum: num, Priority: prio}}
	}
	ip := func(s string) net.IP { return net.ParseIP(s).To4() }
	ruleset := func(tx *nft.Tx) {
		tx.Add(&nft.Table{})
		tx.Add(base("pre", "prerouting", unix.NF_INET_PRE_ROUTING, -100))
		tx.Add(base("early", "prerouting", unix.NF_INET_PRE_ROUTING, -200))
		tx.Add(base("post", "postrouting", unix.NF_INET_POST_ROUTING, 100))
		tx.Add(&nft.Chain{Name: "svc"})
		tx.Add(&nft.Chain{Name: "web"})
		tx.Add(ports)
		tx.Add(elem(8080, "web"))
		tx.Add(&nft.Rule{Chain: "early", Stmts: []nft.Stmt{nft.L4Proto{Name: "tcp"}, nft.DPort{Port: 6666}, drop{}}})
		tx.Add(&nft.Rule{Chain: "early", Stmts: []nft.Stmt{nft.L4Proto{Name: "tcp"}, nft.DPort{Port: 7777}, ct{}}})
		tx.Add(&nft.Rule{Chain: "pre", Stmts: []nft.Stmt{nft.FibLocal{}, nft.Jump{To: "svc"}}})
		tx.Add(&nft.Rule{Chain: "svc", Stmts: []nft.Stmt{vmap{}}})
		tx.Add(&nft.Rule{Chain: "svc", Stmts: []nft.Stmt{nft.L4Proto{Name: "udp"}, nft.DPort{Port: 5000, Last: 5010}, nft.DNATTo(ip("192.0.2.3"), 0)}})
		tx.Add(&nft.Rule{Chain: "web", Stmts: []nft.Stmt{nft.Addr{Spec: "192.0.2.0/24"}, nft.MarkOr{Mark: 0x2000}}})
		tx.Add(&nft.Rule{Chain: "web", Stmts: []nft.Stmt{nft.DNATTo(ip("192.0.2.2"), 80)}})
		tx.Add(&nft.Rule{Chain: "post", Stmts: []nft.Stmt{nft.MarkHas{Mark: 0x2000}, nft.Masquerade{}}})
	}
	if err := apply(k, ruleset); err != nil {
		t.Fatal(err)
	}
	// Ruleset: the objects as held, a failed batch changing nothing, the
	// same ruleset written again printing the same
	written := k.Ruleset()
	for _, want := range []string{"chain pre type nat hook 0 priority -100\n", `[ lookup 1="ports" 2=1 3=0 ]`,
		"set ports flags 0x8 key 8 data 0xffffff00\n    060000001f900000 : verdict -4 web\n"} {
		if !strings.Contains(written, want) {
			t.Errorf("Ruleset lacks %q:\n%s", want, written)
		}
	}
	if err := apply(k, func(tx *nft.Tx) { tx.Add(&nft.Chain{Name: "more"}); tx.Create(&nft.Chain{Name: "svc"}) }); err == nil || k.Ruleset() != written {
		t.Errorf("a refused batch (%v) changed the ruleset:\n%s", err, k.Ruleset())
	}
	k.Flush()
	if err := apply(k, ruleset); err != nil || k.Ruleset() != written {
		t.Errorf("written again (%v):\n%s\nwant:\n%s", err, k.Ruleset(), written)
	}
	local := func(a net.IP) bool { return a.Equal(ip("198.51.100.1")) || a.IsLoopback() }
	for _, tt := range []struct {
		name   string
		p      nfttest.Packet
		want   nfttest.Verdict
		failed string
	}{
		{"a port of the verdict map", nfttest.Packet{Proto: "tcp", Src: ip("203.0.113.9"), Dst: ip("198.51.100.1"), Dport: 8080},
			nfttest.Verdict{Chains: []string{"early", "pre", "svc", "web", "post"}, DNAT: "192.0.2.2:80"}, ""},
		{"hairpin: marked, masqueraded", nfttest.Packet{Proto: "tcp", Src: ip("192.0.2.2"), Dst: ip("198.51.100.1"), Dport: 8080},
			nfttest.Verdict{Chains: []string{"early", "pre", "svc", "web", "post"}, DNAT: "192.0.2.2:80", Masquerade: true}, ""},
		{"a port of a range, kept", nfttest.Packet{Proto: "udp", Src: ip("203.0.113.9"), Dst: ip("198.51.100.1"), Dport: 5010},
			nfttest.Verdict{Chains: []string{"early", "pre", "svc", "post"}, DNAT: "192.0.2.3:5010"}, ""},
		{"past the range", nfttest.Packet{Proto: "udp", Src: ip("203.0.113.9"), Dst: ip("198.51.100.1"), Dport: 5011},
			nfttest.Verdict{Chains: []string{"early", "pre", "svc", "post"}}, ""},
		{"not a local address", nfttest.Packet{Proto: "tcp", Src: ip("203.0.113.9"), Dst: ip("192.0.2.99"), Dport: 8080},
			nfttest.Verdict{Chains: []string{"early", "pre", "post"}}, ""},
		{"the host's own packet: no output chain", nfttest.Packet{Proto: "tcp", Src: ip("127.0.0.1"), Dst: ip("127.0.0.1"), Dport: 8080, Output: true},
			nfttest.Verdict{Chains: []string{"post"}}, ""},
		{"dropped", nfttest.Packet{Proto: "tcp", Src: ip("203.0.113.9"), Dst: ip("198.51.100.1"), Dport: 6666},
			nfttest.Verdict{Chains: []string{"early"}, Dropped: true}, ""},
		{"an expression it does not know", nfttest.Packet{Proto: "tcp", Src: ip("203.0.113.9"), Dst: ip("198.51.100.1"), Dport: 7777},
			nfttest.Verdict{}, "ct: an expression the tracer does not know"},
	} {
		v, err := k.Trace(tt.p, local)
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

	// IPv6: its own table, its header's addresses
	tx := nft.NewTx(nft.IPv6, "t")
	tx.Add(&nft.Table{})
	tx.Add(base("pre", "prerouting", unix.NF_INET_PRE_ROUTING, -100))
	tx.Add(&nft.Rule{Chain: "pre", Stmts: []nft.Stmt{nft.Addr{Dst: true, Spec: "2001:db8:1::1"}, nft.L4Proto{Name: "tcp"}, nft.DPort{Port: 8080},
		nft.DNATTo(net.ParseIP("2001:db8::2"), 80)}})
	msgs, err := tx.Messages()
	if err == nil {
		err = k.Batch(msgs, true)
	}
	if err != nil {
		t.Fatal(err)
	}
	for dst, want := range map[string]string{"2001:db8:1::1": "[2001:db8::2]:80", "2001:db8:1::2": ""} {
		v, err := k.Trace(nfttest.Packet{Family: nft.IPv6, Proto: "tcp", Src: net.ParseIP("2001:db8:9::9"), Dst: net.ParseIP(dst), Dport: 8080}, local)
		if err != nil || v.DNAT != want || !slices.Equal(v.Chains, []string{"pre"}) {
			t.Errorf("IPv6 to %s: %+v, %v; want DNAT %q", dst, v, err, want)
		}
	}
}
