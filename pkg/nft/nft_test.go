package nft_test

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
)

// lookupAnon is a statement of a user's that declares an anonymous set:
// ip saddr { 192.0.2.1, 192.0.2.2 }.
type lookupAnon struct{}

func (lookupAnon) Text(nft.Family) string { return "ip saddr { 192.0.2.1, 192.0.2.2 }" }
func (lookupAnon) Encode(e *nft.Exprs) {
	e.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, 12, 4, nft.Reg1)
	s := e.AnonSet(nft.IPv4Addr.ID, 4, [][]byte{{192, 0, 2, 1}, {192, 0, 2, 2}})
	e.Add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, s.Name)
		a.U32(unix.NFTA_LOOKUP_SREG, nft.Reg1)
		a.U32(unix.NFTA_LOOKUP_SET_ID, s.ID)
	})
}

// every is one object of each kind pkg/nft defines under each verb it
// takes, and a rule of every statement.
func every(f nft.Family) *nft.Tx {
	tx := nft.NewTx(f, "t")
	guard := &nft.BaseChain{Type: "filter", Hook: "input", HookNum: unix.NF_INET_LOCAL_IN}
	key := []nft.Type{f.AddrType(), nft.InetProto, nft.InetService}
	for _, v := range []func(nft.Object){tx.Add, tx.Create} {
		v(&nft.Table{Comment: `a "table"`})
		v(&nft.Chain{Name: "plain"})
		v(&nft.Chain{Name: "based", Base: guard, Comment: "guard"})
		v(&nft.Set{Name: "s", Key: key})
		v(&nft.Set{Name: "vmap", Key: key, Data: []nft.Type{nft.Verdict}, Interval: true})
		v(&nft.Set{Name: "dnat", Key: key, Data: []nft.Type{f.AddrType(), nft.InetService}})
	}
	ip := net.ParseIP("192.0.2.2")
	if f == nft.IPv6 {
		ip = net.ParseIP("2001:db8::2")
	}
	tx.Add(&nft.Rule{Chain: "plain", Comment: "every statement", Stmts: []nft.Stmt{
		nft.L4Proto{Name: "udp"}, nft.DPort{Port: 53}, nft.Addr{Dst: true, Spec: ip.String()},
		nft.FibLocal{}, nft.MarkHas{Mark: 0x2000}, nft.MarkOr{Mark: 0x4000}, nft.DNATTo(ip, 5353)}})
	tx.Add(&nft.Rule{Chain: "plain", Stmts: []nft.Stmt{nft.DPort{Port: 20000, Last: 20999}, nft.Addr{Spec: "10.0.0.0/9"}, nft.DNATTo(ip, 0)}})
	tx.Add(&nft.Rule{Chain: "based", Stmts: []nft.Stmt{nft.MarkHas{Mark: 1}, nft.Masquerade{}}})
	tx.Add(&nft.Rule{Chain: "based", Stmts: []nft.Stmt{nft.Jump{To: "plain"}}})
	addr := ip.To4()
	if f == nft.IPv6 {
		addr = ip.To16()
	}
	k := func(port int) []byte {
		return append(append([]byte(nil), addr...), 6, 0, 0, 0, byte(port>>8), byte(port), 0, 0)
	}
	vmap := &nft.Set{Name: "vmap", Key: key, Data: []nft.Type{nft.Verdict}, Interval: true}
	dnat := &nft.Set{Name: "dnat", Key: key, Data: []nft.Type{f.AddrType(), nft.InetService}}
	for _, v := range []func(nft.Object){tx.Add, tx.Create} {
		v(&nft.Element{Set: vmap, Key: k(20000), KeyEnd: k(20999), Goto: "plain"})
		v(&nft.Element{Set: dnat, Key: k(8080), Data: append(append([]byte(nil), addr...), 0, 80, 0, 0), Comment: "owner srcs"})
		v(&nft.Element{Set: &nft.Set{Name: "s", Key: key}, Key: k(53), Comment: "owner"})
	}
	tx.Delete(&nft.Element{Set: vmap, Key: k(20000), KeyEnd: k(20999)})
	tx.Flush(&nft.Chain{Name: "plain"})
	tx.Delete(&nft.Rule{Chain: "based", Handle: 7})
	tx.Delete(&nft.Set{Name: "s"})
	tx.Delete(&nft.Chain{Name: "plain"})
	tx.Delete(&nft.Table{})
	return tx
}

// TestTextAsKnftables: every object and statement is written as
// knftables writes it (a validation error of knftables' would show as
// "# ERROR").
func TestTextAsKnftables(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		tx := every(f)
		want := nfttest.Knftables(tx, func(*nft.Tx, nft.Object) knftables.Object { t.Fatal("an object of no kind"); return nil })
		if got := tx.Text(); got != want {
			t.Errorf("%s:\n%s\nknftables writes\n%s", f, got, want)
		}
	}
}

// TestMessages: one message per operation, with the types, flags and
// set attributes the kernel takes; a rule's anonymous set comes first,
// and a failed message is named as its operation's command.
func TestMessages(t *testing.T) {
	tx := nft.NewTx(nft.IPv4, "t")
	tx.Add(&nft.Table{})
	tx.Create(&nft.Set{Name: "ranges", Key: []nft.Type{nft.InetProto, nft.InetService}, Data: []nft.Type{nft.Verdict}, Interval: true})
	tx.Add(&nft.Set{Name: "targets", Key: []nft.Type{nft.IPv6Addr}, Data: []nft.Type{nft.IPv4Addr, nft.InetService}})
	tx.Add(&nft.Rule{Chain: "c", Comment: "anon", Stmts: []nft.Stmt{lookupAnon{}}})
	tx.Delete(&nft.Chain{Name: "c"})
	msgs, err := tx.Messages()
	if err != nil {
		t.Fatal(err)
	}
	types := []int{unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_NEWSET, unix.NFT_MSG_NEWSET,
		unix.NFT_MSG_NEWSET, unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELCHAIN}
	if len(msgs) != len(types) {
		t.Fatalf("%d messages, want %d", len(msgs), len(types))
	}
	for i, typ := range types {
		if msgs[i].Type != nfnl.NftType(typ) || msgs[i].Family != unix.NFPROTO_IPV4 {
			t.Errorf("message %d: type %#x family %d, want %#x", i, msgs[i].Type, msgs[i].Family, nfnl.NftType(typ))
		}
	}
	if msgs[1].Flags&unix.NLM_F_EXCL == 0 || msgs[2].Flags&unix.NLM_F_EXCL != 0 {
		t.Errorf("create/add flags %#x %#x", msgs[1].Flags, msgs[2].Flags)
	}
	u32 := func(m nfnl.Msg, typ uint16) uint32 {
		v, _ := nfnl.Find(m.Attrs, typ)
		if len(v) != 4 {
			t.Fatalf("attribute %d: %x", typ, v)
		}
		return uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
	}
	if got, want := u32(msgs[1], unix.NFTA_SET_FLAGS), uint32(unix.NFT_SET_MAP|unix.NFT_SET_INTERVAL|0x80); got != want {
		t.Errorf("interval map flags %#x, want %#x", got, want)
	}
	if got := u32(msgs[1], unix.NFTA_SET_KEY_LEN); got != 8 {
		t.Errorf("proto . port key length %d, want 8", got)
	}
	if got := u32(msgs[2], unix.NFTA_SET_DATA_LEN); got != 8 {
		t.Errorf("ipv4_addr . inet_service data length %d, want 8", got)
	}
	if got, want := u32(msgs[2], unix.NFTA_SET_KEY_TYPE), uint32(nft.IPv6Addr.ID); got != want {
		t.Errorf("key type %d, want %d", got, want)
	}
	for i, want := range map[int]string{0: `add table ip t { comment "" ; }`, 3: `add rule ip t c ip saddr { 192.0.2.1, 192.0.2.2 } comment "anon"`,
		5: `add rule ip t c ip saddr { 192.0.2.1, 192.0.2.2 } comment "anon"`, 6: "delete chain ip t c"} {
		err := &nft.Error{Op: tx.Describe(&nfnl.Error{Index: i, Errno: unix.EEXIST}), Err: unix.EEXIST}
		if !strings.HasPrefix(err.Error(), want+":") || !errors.Is(err, unix.EEXIST) {
			t.Errorf("message %d fails as %q, want it named %q", i, err, want)
		}
	}
	if d := tx.Describe(errors.New("other")); d != "ip transaction of 5 operations" {
		t.Errorf("a non-netlink error: %q", d)
	}
	if !nft.IsNotFound(&nft.Error{Op: "get chain x", Err: &nfnl.Error{Errno: unix.ENOENT}}) || nft.IsNotFound(unix.EEXIST) {
		t.Error("IsNotFound does not follow the error chain to ENOENT")
	}
}

// TestConditionsNeedNft: a rule holding nft syntax asks for nft and has
// no netlink encoding.
func TestConditionsNeedNft(t *testing.T) {
	tx := nft.NewTx(nft.IPv4, "t")
	tx.Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.Conditions{Nft: "ip saddr != 203.0.113.0/24"}, nft.Masquerade{}}})
	if !tx.NeedsNft() {
		t.Error("no nft asked for")
	}
	if _, err := tx.Messages(); err == nil {
		t.Error("conditions were encoded")
	}
	if got := tx.String(); got != "add rule ip t c ip saddr != 203.0.113.0/24 masquerade" {
		t.Errorf("String = %q", got)
	}
}

func TestCommentOf(t *testing.T) {
	if got := nft.CommentOf(nft.Comment("net=a id=b if=c")); got != "net=a id=b if=c" {
		t.Errorf("CommentOf = %q", got)
	}
	// Other user data first (type 1, 2 bytes), then the comment.
	ud := append([]byte{1, 2, 'z', 0}, nft.Comment("x")...)
	if got := nft.CommentOf(ud); got != "x" {
		t.Errorf("CommentOf after other data = %q", got)
	}
	if got := nft.CommentOf([]byte{0, 200, 'a'}); got != "" {
		t.Errorf("CommentOf of truncated data = %q", got)
	}
}

// TestElementText: an element's key, interval, data and comment as nft
// spells them (the knftables test holds the syntax; this the values).
func TestElementText(t *testing.T) {
	tx := nft.NewTx(nft.IPv4, "t")
	key := []nft.Type{nft.IPv4Addr, nft.InetProto, nft.InetService}
	k := func(proto byte, port int) []byte {
		return []byte{198, 51, 100, 1, proto, 0, 0, 0, byte(port >> 8), byte(port), 0, 0}
	}
	tx.Add(&nft.Element{Set: &nft.Set{Name: "m", Key: key, Data: []nft.Type{nft.Verdict}, Interval: true},
		Key: k(17, 5000), KeyEnd: k(17, 5002), Goto: "c"})
	tx.Create(&nft.Element{Set: &nft.Set{Name: "d", Key: key, Data: []nft.Type{nft.IPv4Addr, nft.InetService}},
		Key: k(132, 9000), Data: []byte{192, 0, 2, 2, 0x23, 0x28, 0, 0}, Comment: "owner"})
	want := `add element ip t m { 198.51.100.1 . udp . 5000-5002 : goto c }
create element ip t d { 198.51.100.1 . sctp . 9000 comment "owner" : 192.0.2.2 . 9000 }
`
	if got := tx.Text(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestParsePrefix(t *testing.T) {
	for spec, want := range map[string]string{"192.0.2.1": "192.0.2.1/32", "10.1.2.3/9": "10.0.0.0/9",
		"2001:db8::1": "2001:db8::1/128", "junk": "0.0.0.0/32"} {
		if got := nft.ParsePrefix(spec).String(); got != want {
			t.Errorf("ParsePrefix(%q) = %s, want %s", spec, got, want)
		}
	}
}

// TestDecodeRule: what the statements write reads back as the
// statements written, an address as the prefix it matches.
func TestDecodeRule(t *testing.T) {
	ip := net.ParseIP("192.0.2.2")
	for _, tt := range []struct {
		f           nft.Family
		stmts, want []nft.Stmt
	}{
		{nft.IPv4, []nft.Stmt{nft.L4Proto{Name: "udp"}, nft.DPort{Port: 53}, nft.Addr{Spec: "10.1.2.3/9"}, nft.DNATTo(ip, 5353)},
			[]nft.Stmt{nft.L4Proto{Name: "udp"}, nft.DPort{Port: 53}, nft.Addr{Spec: "10.0.0.0/9"}, nft.DNATTo(ip, 5353)}},
		{nft.IPv4, []nft.Stmt{nft.DPort{Port: 20000, Last: 20999}, nft.Addr{Spec: "192.0.2.0/24"}, nft.Addr{Dst: true, Spec: "198.51.100.1/32"}, nft.DNATTo(ip, 0)},
			[]nft.Stmt{nft.DPort{Port: 20000, Last: 20999}, nft.Addr{Spec: "192.0.2.0/24"}, nft.Addr{Dst: true, Spec: "198.51.100.1"}, nft.DNATTo(ip, 0)}},
		{nft.IPv6, []nft.Stmt{nft.L4Proto{Name: "sctp"}, nft.Addr{Dst: true, Spec: "2001:db8::/33"}, nft.DNATTo(net.ParseIP("2001:db8::2"), 80)}, nil},
		{nft.IPv4, []nft.Stmt{nft.FibLocal{}, nft.Jump{To: "dispatch"}}, nil},
		{nft.IPv4, []nft.Stmt{nft.MarkOr{Mark: 0x2000}}, nil},
		{nft.IPv4, []nft.Stmt{nft.MarkHas{Mark: 0x2000}, nft.Masquerade{}}, nil},
		{nft.IPv4, []nft.Stmt{nft.Lookup{Set: "v", Verdict: true}, nft.Lookup{Set: "m", Data: true}, nft.Lookup{Set: "s"}, nft.Lookup{Set: "n", Inv: true}, nft.Drop{}}, nil},
	} {
		r := &nft.Rule{Chain: "x", Comment: "c", Stmts: tt.stmts}
		var a nfnl.Attrs
		r.Attrs(nft.NewTx(tt.f, "t"), &a)
		want := tt.want
		if want == nil {
			want = tt.stmts
		}
		if got := nft.DecodeRule(tt.f, nfnl.Parse(a.Bytes())); got.Comment != "c" || !slices.Equal(got.Stmts, want) {
			t.Errorf("%s %q reads back as %q %+v, want %+v", tt.f, r.StmtText(tt.f), got.Comment, got.Stmts, want)
		}
	}
}

// TestLacks: a rule read back is judged by what the written one does
// alone: what it does besides (conditions nft compiled) passes, an
// anonymous set of its own stands for the written one's, anything the
// written rule does otherwise is named as nft spells it.
func TestLacks(t *testing.T) {
	written := &nft.Rule{Chain: "x", Comment: "c", Stmts: []nft.Stmt{nft.Conditions{Nft: "ip saddr != 203.0.113.0/24"},
		nft.L4Proto{Name: "tcp"}, nft.DPort{Port: 8080}, nft.Addr{Dst: true, Spec: "198.51.100.1"}, nft.DNATTo(net.ParseIP("192.0.2.2"), 80)}}
	want := written.AsRead(nft.IPv4)
	replace := func(i int, s nft.Stmt) []nft.Stmt {
		out := slices.Clone(want.Stmts)
		if s == nil {
			return slices.Delete(out, i, i+1)
		}
		out[i] = s
		return out
	}
	for _, tt := range []struct {
		name  string
		read  []nft.Stmt
		lacks string
	}{
		{"as written", want.Stmts, ""},
		{"with conditions matched besides", append([]nft.Stmt{nft.Addr{Spec: "10.0.0.0/8"}, nft.MarkHas{Mark: 1}}, want.Stmts...), ""},
		{"another protocol", replace(0, nft.L4Proto{Name: "udp"}), "meta l4proto tcp"},
		{"a span of ports", replace(1, nft.DPort{Port: 8080, Last: 8090}), "th dport 8080"},
		{"another host address", replace(2, nft.Addr{Dst: true, Spec: "198.51.100.2"}), "ip daddr 198.51.100.1"},
		{"no DNAT", replace(3, nil), "dnat to 192.0.2.2:80"},
	} {
		got := &nft.Rule{Stmts: tt.read}
		if lacks := got.Lacks(nft.IPv4, want); lacks != tt.lacks {
			t.Errorf("%s: lacks %q, want %q", tt.name, lacks, tt.lacks)
		}
	}
	anon := &nft.Rule{Stmts: []nft.Stmt{nft.Lookup{Set: "__map3", Data: true}}}
	if lacks := (&nft.Rule{Stmts: []nft.Stmt{nft.Lookup{Set: "__map0", Data: true}}}).Lacks(nft.IPv4, anon); lacks != "" {
		t.Errorf("another anonymous map: lacks %q", lacks)
	}
	if lacks := (&nft.Rule{Stmts: []nft.Stmt{nft.Lookup{Set: "hostports", Data: true}}}).Lacks(nft.IPv4, anon); lacks == "" {
		t.Error("a named map passed for an anonymous one")
	}
	if lacks := (&nft.Rule{Stmts: []nft.Stmt{nft.Lookup{Set: "__set0"}}}).Lacks(nft.IPv4, anon); lacks != "map @__map3" {
		t.Errorf("an anonymous set of another kind: lacks %q", lacks)
	}
}

// TestDecodeElements: elements as written read back: key, interval end,
// goto or data, comment.
func TestDecodeElements(t *testing.T) {
	set := &nft.Set{Name: "m", Key: []nft.Type{nft.InetProto, nft.InetService}, Data: []nft.Type{nft.Verdict}, Interval: true}
	for _, want := range []nft.Element{
		{Set: set, Key: []byte{6, 0, 0, 0, 0x4e, 0x20, 0, 0}, KeyEnd: []byte{6, 0, 0, 0, 0x52, 0x07, 0, 0}, Goto: "c"},
		{Set: set, Key: []byte{17, 0, 0, 0, 0, 53, 0, 0}, Data: []byte{192, 0, 2, 2, 0, 53, 0, 0}, Comment: "owner srcs"},
		{Set: set, Key: []byte{132, 0, 0, 0, 0, 80, 0, 0}},
	} {
		var a nfnl.Attrs
		want.Attrs(&a, "t", true)
		got := nft.DecodeElements(a.Bytes())
		if len(got) != 1 || got[0].Set.Name != "m" || !bytes.Equal(got[0].Key, want.Key) || !bytes.Equal(got[0].KeyEnd, want.KeyEnd) ||
			got[0].Goto != want.Goto || !bytes.Equal(got[0].Data, want.Data) || got[0].Comment != want.Comment {
			t.Errorf("%+v reads back as %+v", want, got)
		}
	}
}
