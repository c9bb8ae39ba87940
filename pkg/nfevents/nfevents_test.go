package nfevents

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/test/userns"
)

// The tests run in a user and network namespace of their own (no root
// needed): they change the firewall there.
func TestMain(m *testing.M) { userns.Main(m) }

// A committed change brings one token; changes while one is pending
// coalesce into it; Drain drops it; Close closes C.
func TestSubscription(t *testing.T) {
	userns.Require(t)
	s, err := Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	c, err := nfnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	change := func(msg int, name string) {
		var a nfnl.Attrs
		a.String(unix.NFTA_TABLE_NAME, name)
		if err := c.Batch([]nfnl.Msg{{Type: nfnl.NftType(msg), Flags: unix.NLM_F_CREATE, Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()}}, true); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(what string) {
		select {
		case <-s.C:
		case <-time.After(5 * time.Second):
			t.Fatalf("no token in 5 s after %s", what)
		}
	}
	change(unix.NFT_MSG_NEWTABLE, "nat")
	wait("a new table")
	change(unix.NFT_MSG_NEWTABLE, "cni_portmap")
	change(unix.NFT_MSG_DELTABLE, "cni_portmap")
	time.Sleep(100 * time.Millisecond) // both read, one token pending
	s.Drain()
	select {
	case <-s.C:
		t.Error("a token after Drain: changes did not coalesce into one")
	case <-time.After(200 * time.Millisecond):
	}
	s.Close()
	select {
	case _, ok := <-s.C:
		for ok {
			_, ok = <-s.C
		}
	case <-time.After(2 * time.Second):
		t.Fatal("C not closed 2 s after Close")
	}
}

// Another program's tables and chains wake nobody: their commits (a
// table, a chain, a set, its elements, again and again, as kube-proxy's
// nftables mode and firewalld commit; chains of their own in iptables'
// nat table, as kube-proxy's iptables mode commits) bring no token; a
// change to portmap's chains or a built-in one of the nat or filter
// table of ip or ip6, or to ours, does, and so does any table's
// deletion.
func TestForeignTablesWakeNobody(t *testing.T) {
	userns.Require(t)
	s, err := Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := nfnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	table := func(msg int, family uint8, name string) nfnl.Msg {
		var a nfnl.Attrs
		a.String(unix.NFTA_TABLE_NAME, name)
		return nfnl.Msg{Type: nfnl.NftType(msg), Flags: unix.NLM_F_CREATE, Family: family, Attrs: a.Bytes()}
	}
	chain := func(family uint8, tbl, name string) nfnl.Msg {
		var a nfnl.Attrs
		a.String(unix.NFTA_CHAIN_TABLE, tbl).String(unix.NFTA_CHAIN_NAME, name)
		return nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_NEWCHAIN), Flags: unix.NLM_F_CREATE, Family: family, Attrs: a.Bytes()}
	}
	commit := func(msgs ...nfnl.Msg) {
		t.Helper()
		if err := c.Batch(msgs, true); err != nil {
			t.Fatal(err)
		}
	}
	token := func(within time.Duration) bool {
		select {
		case <-s.C:
			return true
		case <-time.After(within):
			return false
		}
	}
	for i := range 20 {
		commit(table(unix.NFT_MSG_NEWTABLE, unix.NFPROTO_IPV4, "kube-proxy"), chain(unix.NFPROTO_IPV4, "kube-proxy", fmt.Sprintf("svc-%d", i)),
			table(unix.NFT_MSG_NEWTABLE, unix.NFPROTO_INET, "firewalld"), chain(unix.NFPROTO_INET, "firewalld", fmt.Sprintf("zone-%d", i)),
			table(unix.NFT_MSG_NEWTABLE, unix.NFPROTO_ARP, "filter"))
	}
	// kube-proxy's iptables mode: its chains in iptables' nat table
	commit(table(unix.NFT_MSG_NEWTABLE, unix.NFPROTO_IPV4, "nat"))
	token(300 * time.Millisecond) // the nat table's own creation
	for i := range 20 {
		commit(chain(unix.NFPROTO_IPV4, "nat", fmt.Sprintf("KUBE-SVC-%d", i)))
	}
	if token(300 * time.Millisecond) {
		t.Fatal("a token after 40 commits of other programs' tables and chains")
	}
	for _, tt := range []struct {
		what string
		msgs []nfnl.Msg
	}{
		{"a chain in ip nat", []nfnl.Msg{table(unix.NFT_MSG_NEWTABLE, unix.NFPROTO_IPV4, "nat"), chain(unix.NFPROTO_IPV4, "nat", "CNI-HOSTPORT-DNAT")}},
		{"a chain in ip6 filter", []nfnl.Msg{table(unix.NFT_MSG_NEWTABLE, unix.NFPROTO_IPV6, "filter"), chain(unix.NFPROTO_IPV6, "filter", "FORWARD")}},
		{"our table", []nfnl.Msg{table(unix.NFT_MSG_NEWTABLE, unix.NFPROTO_IPV6, "cni_portmap")}},
		{"another table's deletion", []nfnl.Msg{table(unix.NFT_MSG_DELTABLE, unix.NFPROTO_INET, "firewalld")}},
	} {
		commit(tt.msgs...)
		if !token(5 * time.Second) {
			t.Errorf("no token after %s", tt.what)
		}
	}
}

// Relevant reads a datagram's messages: their subsystem, type, family
// and table.
func TestRelevant(t *testing.T) {
	msg := func(typ int, family uint8, attrs ...[2]any) []byte {
		var a nfnl.Attrs
		for _, kv := range attrs {
			a.String(kv[0].(uint16), kv[1].(string))
		}
		body := append([]byte{family, unix.NFNETLINK_V0, 0, 0}, a.Bytes()...)
		h := make([]byte, unix.SizeofNlMsghdr)
		binary.NativeEndian.PutUint32(h[0:4], uint32(len(h)+len(body)))
		binary.NativeEndian.PutUint16(h[4:6], uint16(typ))
		return append(h, body...)
	}
	nft := func(m int) int { return unix.NFNL_SUBSYS_NFTABLES<<8 | m }
	tbl := func(name string) [2]any { return [2]any{uint16(1), name} }
	rchain := func(name string) [2]any { return [2]any{uint16(unix.NFTA_RULE_CHAIN), name} }
	cchain := func(name string) [2]any { return [2]any{uint16(unix.NFTA_CHAIN_NAME), name} }
	for _, tt := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"a rule in ip nat, its chain not named", msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_IPV4, tbl("nat")), true},
		{"a rule of ours in ip nat", msg(nft(unix.NFT_MSG_DELRULE), unix.NFPROTO_IPV4, tbl("nat"), rchain("CNI-HOSTPORT-DNAT")), true},
		{"a rule in an attachment's chain", msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_IPV6, tbl("nat"), rchain("CNI-DN-4cbb58d4f7a53f51ff607")), true},
		{"a rule in PREROUTING", msg(nft(unix.NFT_MSG_DELRULE), unix.NFPROTO_IPV4, tbl("nat"), rchain("PREROUTING")), true},
		{"a rule destroyed in FORWARD", msg(nft(28), unix.NFPROTO_IPV4, tbl("filter"), rchain("FORWARD")), true},
		{"our forward chain", msg(nft(unix.NFT_MSG_DELCHAIN), unix.NFPROTO_IPV4, tbl("filter"), cchain("CNI-HOSTPORT-FWD")), true},
		{"kube-proxy's rule in ip nat", msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_IPV4, tbl("nat"), rchain("KUBE-SVC-ABCDEF")), false},
		{"kube-proxy's rule deleted", msg(nft(unix.NFT_MSG_DELRULE), unix.NFPROTO_IPV6, tbl("nat"), rchain("KUBE-SERVICES")), false},
		{"Docker's chain in ip filter", msg(nft(unix.NFT_MSG_NEWCHAIN), unix.NFPROTO_IPV4, tbl("filter"), cchain("DOCKER-USER")), false},
		{"Calico's chain deleted", msg(nft(27), unix.NFPROTO_IPV4, tbl("filter"), cchain("cali-FORWARD")), false},
		{"a chain of ip nat, unnamed", msg(nft(unix.NFT_MSG_NEWCHAIN), unix.NFPROTO_IPV4, tbl("nat")), true},
		{"a set in ip nat", msg(nft(unix.NFT_MSG_NEWSET), unix.NFPROTO_IPV4, tbl("nat")), true},
		{"an element of ip6 cni_portmap", msg(nft(unix.NFT_MSG_NEWSETELEM), unix.NFPROTO_IPV6, tbl("cni_portmap")), true},
		{"upstream's table", msg(nft(unix.NFT_MSG_DELRULE), unix.NFPROTO_INET, tbl("cni_hostport")), true},
		{"a rule in inet firewalld", msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_INET, tbl("firewalld")), false},
		{"an inet table named nat", msg(nft(unix.NFT_MSG_NEWCHAIN), unix.NFPROTO_INET, tbl("nat")), false},
		{"arp filter", msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_ARP, tbl("filter")), false},
		{"kube-proxy's table deleted", msg(nft(unix.NFT_MSG_DELTABLE), unix.NFPROTO_IPV4, tbl("kube-proxy")), true},
		{"a table destroyed", msg(nft(26), unix.NFPROTO_INET, tbl("x")), true},
		{"the end of a batch", msg(nft(unix.NFT_MSG_NEWGEN), unix.NFPROTO_UNSPEC), false},
		{"another subsystem", msg(unix.NFNL_SUBSYS_CTNETLINK<<8, unix.NFPROTO_IPV4, tbl("nat")), false},
		{"no table named", msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_IPV4), true},
		{"a foreign batch", append(msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_IPV4, tbl("kube-proxy")), msg(nft(unix.NFT_MSG_NEWGEN), 0)...), false},
		{"ours after a foreign one", append(msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_IPV4, tbl("kube-proxy")), msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_IPV4, tbl("nat"))...), true},
		{"cut short", msg(nft(unix.NFT_MSG_NEWRULE), unix.NFPROTO_IPV4, tbl("kube-proxy"))[:20], true},
	} {
		if got := Relevant(tt.b); got != tt.want {
			t.Errorf("%s: Relevant = %v, want %v", tt.name, got, tt.want)
		}
	}
}
