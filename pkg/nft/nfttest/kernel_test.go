package nfttest_test

import (
	"errors"
	"net"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
)

// element is an nft.Object of the test's: an element of set "m" (key
// inet_proto . inet_service) with a goto verdict, or of the interval
// map "r" with its last port.
type element struct {
	set        string
	port, last int
	chain      string
}

func (e element) Text(tx *nft.Tx, v nft.Verb, b *strings.Builder) {}

func (e element) Encode(tx *nft.Tx, v nft.Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSETELEM)
	if v == nft.Delete {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELSETELEM)
	}
	key := func(p int) []byte { return []byte{unix.IPPROTO_TCP, 0, 0, 0, byte(p >> 8), byte(p), 0, 0} }
	a.String(unix.NFTA_SET_ELEM_LIST_TABLE, tx.TableName)
	a.String(unix.NFTA_SET_ELEM_LIST_SET, e.set)
	a.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
		a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
			nft.Value(a, unix.NFTA_SET_ELEM_KEY, key(e.port))
			if e.last != 0 {
				nft.Value(a, nft.AttrSetElemKeyEnd, key(e.last))
			}
			if e.chain != "" && v != nft.Delete {
				a.Nested(unix.NFTA_SET_ELEM_DATA, func(a *nfnl.Attrs) { nft.VerdictData(a, unix.NFT_GOTO, e.chain) })
			}
		})
	})
	return nil, nil
}

var key = []nft.Type{nft.InetProto, nft.InetService}

// apply commits the operations one transaction makes of each step.
func apply(k *nfttest.Kernel, ops ...func(tx *nft.Tx)) error {
	tx := nft.NewTx(nft.IPv4, "t")
	for _, op := range ops {
		op(tx)
	}
	msgs, err := tx.Messages()
	if err != nil {
		return err
	}
	return k.Batch(msgs, true)
}

func skeleton(tx *nft.Tx) {
	tx.Add(&nft.Table{Comment: "t"})
	tx.Add(&nft.Chain{Name: "a"})
	tx.Add(&nft.Chain{Name: "b"})
	tx.Add(&nft.Set{Name: "m", Key: key, Data: []nft.Type{nft.Verdict}})
	tx.Add(&nft.Set{Name: "r", Key: key, Data: []nft.Type{nft.Verdict}, Interval: true})
}

// TestErrnos: each operation fails with the errno the kernel gives, the
// batch names the failed message, and nothing of a failed batch stays.
func TestErrnos(t *testing.T) {
	for _, tt := range []struct {
		name  string
		op    func(tx *nft.Tx)
		errno unix.Errno
	}{
		{"create an existing chain", func(tx *nft.Tx) { tx.Create(&nft.Chain{Name: "a"}) }, unix.EEXIST},
		{"add an existing chain", func(tx *nft.Tx) { tx.Add(&nft.Chain{Name: "a"}) }, 0},
		{"a chain of a missing table", func(tx *nft.Tx) { tx.Delete(&nft.Table{}); tx.Add(&nft.Chain{Name: "a"}) }, unix.ENOENT},
		{"delete a chain with rules", func(tx *nft.Tx) { tx.Delete(&nft.Chain{Name: "a"}) }, unix.EBUSY},
		{"delete a chain a rule jumps to", func(tx *nft.Tx) { tx.Delete(&nft.Chain{Name: "b"}) }, unix.EBUSY},
		{"delete a chain an element names", func(tx *nft.Tx) {
			tx.Add(&nft.Chain{Name: "c"})
			tx.Add(element{set: "m", port: 81, chain: "c"})
			tx.Delete(&nft.Chain{Name: "c"})
		}, unix.EBUSY},
		{"delete a missing chain", func(tx *nft.Tx) { tx.Delete(&nft.Chain{Name: "x"}) }, unix.ENOENT},
		{"a jump to a missing chain", func(tx *nft.Tx) { tx.Add(&nft.Rule{Chain: "a", Stmts: []nft.Stmt{nft.Jump{To: "x"}}}) }, unix.ENOENT},
		{"a rule of a missing chain", func(tx *nft.Tx) { tx.Add(&nft.Rule{Chain: "x", Stmts: []nft.Stmt{nft.Masquerade{}}}) }, unix.ENOENT},
		{"delete a missing rule", func(tx *nft.Tx) { tx.Delete(&nft.Rule{Chain: "a", Handle: 99}) }, unix.ENOENT},
		{"delete a set a rule looks up", func(tx *nft.Tx) { tx.Delete(&nft.Set{Name: "m"}) }, unix.EBUSY},
		{"create an existing element", func(tx *nft.Tx) { tx.Create(element{set: "m", port: 80, chain: "b"}) }, unix.EEXIST},
		{"add an existing element", func(tx *nft.Tx) { tx.Add(element{set: "m", port: 80, chain: "b"}) }, 0},
		{"add an element of other data", func(tx *nft.Tx) { tx.Add(element{set: "m", port: 80, chain: "a"}) }, unix.EEXIST},
		{"an element of a missing set", func(tx *nft.Tx) { tx.Add(element{set: "x", port: 80, chain: "b"}) }, unix.ENOENT},
		{"an element going to a missing chain", func(tx *nft.Tx) { tx.Add(element{set: "m", port: 81, chain: "x"}) }, unix.ENOENT},
		{"delete a missing element", func(tx *nft.Tx) { tx.Delete(element{set: "m", port: 81}) }, unix.ENOENT},
		{"an interval overlapping another", func(tx *nft.Tx) { tx.Add(element{set: "r", port: 1050, last: 1200, chain: "b"}) }, unix.EEXIST},
		{"an interval beside another", func(tx *nft.Tx) { tx.Add(element{set: "r", port: 1100, last: 1200, chain: "b"}) }, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := nfttest.New()
			if err := apply(k, skeleton, func(tx *nft.Tx) {
				tx.Add(&nft.Rule{Chain: "a", Stmts: []nft.Stmt{nft.Jump{To: "b"}}})
				tx.Add(&nft.Rule{Chain: "a", Stmts: []nft.Stmt{lookup("m")}})
				tx.Add(element{set: "m", port: 80, chain: "b"})
				tx.Add(element{set: "r", port: 1000, last: 1099, chain: "b"})
			}); err != nil {
				t.Fatal(err)
			}
			before := dump(t, k)
			err := apply(k, func(tx *nft.Tx) { tx.Add(&nft.Chain{Name: "first"}) }, tt.op)
			var ne *nfnl.Error
			switch {
			case tt.errno == 0 && err != nil:
				t.Fatalf("%v, want none", err)
			case tt.errno == 0:
				return
			case !errors.As(err, &ne) || ne.Errno != tt.errno || ne.Index == 0:
				t.Fatalf("%v, want %v of a message after the first", err, tt.errno)
			}
			if got := dump(t, k); got != before {
				t.Errorf("a failed batch changed the tables:\n%s\nwas\n%s", got, before)
			}
			if k.Commits != 1 {
				t.Errorf("%d commits, want 1", k.Commits)
			}
		})
	}
}

// lookup: th dport vmap @set, a lookup of a named set.
type lookup string

func (l lookup) Text(nft.Family) string { return "th dport vmap @" + string(l) }
func (l lookup) Encode(e *nft.Exprs) {
	e.Payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, nft.Reg1)
	e.Add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, string(l))
		a.U32(unix.NFTA_LOOKUP_SREG, nft.Reg1)
		a.U32(unix.NFTA_LOOKUP_DREG, nft.RegVerdict)
	})
}

// dump is every chain, rule, set and element the kernel answers dumps
// with, as their names and counts.
func dump(t *testing.T, k *nfttest.Kernel) string {
	t.Helper()
	var out []string
	for _, typ := range []int{unix.NFT_MSG_GETCHAIN, unix.NFT_MSG_GETRULE, unix.NFT_MSG_GETSET} {
		replies, err := k.Dump(nfnl.Msg{Type: nfnl.NftType(typ), Family: unix.NFPROTO_IPV4})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range replies {
			out = append(out, string(r.Attrs))
		}
	}
	for _, set := range []string{"m", "r"} {
		var a nfnl.Attrs
		a.String(unix.NFTA_SET_ELEM_LIST_TABLE, "t").String(unix.NFTA_SET_ELEM_LIST_SET, set)
		replies, err := k.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETSETELEM), Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range replies {
			out = append(out, string(r.Attrs))
		}
	}
	return strings.Join(out, "\n")
}

// TestAnonymousSets: a rule's anonymous map is named by the kernel, read
// back by that name, and goes with its rule.
func TestAnonymousSets(t *testing.T) {
	k := nfttest.New()
	ip := net.ParseIP("192.0.2.2")
	dnat := anonDNAT{to: ip}
	if err := apply(k, skeleton, func(tx *nft.Tx) {
		tx.Add(&nft.Rule{Chain: "a", Comment: "first", Stmts: []nft.Stmt{dnat}})
		tx.Add(&nft.Rule{Chain: "a", Comment: "second", Stmts: []nft.Stmt{dnat}})
	}); err != nil {
		t.Fatal(err)
	}
	var req nfnl.Attrs
	req.String(unix.NFTA_RULE_TABLE, "t").String(unix.NFTA_RULE_CHAIN, "a")
	rules, err := k.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETRULE), Family: unix.NFPROTO_IPV4, Attrs: req.Bytes()})
	if err != nil || len(rules) != 2 {
		t.Fatalf("%d rules, %v", len(rules), err)
	}
	var names []string
	for _, r := range rules {
		if h, _ := nfnl.RuleJumps(r.Attrs); h == 0 {
			t.Error("a rule without a handle")
		}
		names = append(names, lookedUp(r.Attrs))
	}
	if names[0] != "__map0" || names[1] != "__map1" {
		t.Fatalf("anonymous maps named %v, want __map0 and __map1", names)
	}
	var get nfnl.Attrs
	get.String(unix.NFTA_SET_ELEM_LIST_TABLE, "t").String(unix.NFTA_SET_ELEM_LIST_SET, "__map1")
	if els, err := k.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETSETELEM), Family: unix.NFPROTO_IPV4, Attrs: get.Bytes()}); err != nil || len(els) != 1 {
		t.Fatalf("__map1's elements: %v, %v", els, err)
	}
	first, _ := nfnl.RuleJumps(rules[0].Attrs)
	if err := apply(k, func(tx *nft.Tx) { tx.Delete(&nft.Rule{Chain: "a", Handle: first}) }); err != nil {
		t.Fatal(err)
	}
	var set nfnl.Attrs
	set.String(unix.NFTA_SET_TABLE, "t").String(unix.NFTA_SET_NAME, "__map0")
	if _, err := k.GetOne(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETSET), Family: unix.NFPROTO_IPV4, Attrs: set.Bytes()}); !nft.IsNotFound(err) {
		t.Errorf("__map0 after its rule's deletion: %v, want ENOENT", err)
	}
	if err := apply(k, func(tx *nft.Tx) { tx.Add(&nft.Rule{Chain: "a", Stmts: []nft.Stmt{dnat}}) }); err != nil {
		t.Fatal(err)
	}
	rules, _ = k.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETRULE), Family: unix.NFPROTO_IPV4, Attrs: req.Bytes()})
	if got := lookedUp(rules[len(rules)-1].Attrs); got != "__map0" {
		t.Errorf("a new anonymous map named %s, want the free __map0", got)
	}
}

// anonDNAT: dnat to th dport map { 80 : 192.0.2.2 }, an anonymous map of
// the rule's.
type anonDNAT struct{ to net.IP }

func (anonDNAT) Text(nft.Family) string { return "dnat to th dport map { 80 : 192.0.2.2 }" }
func (s anonDNAT) Encode(e *nft.Exprs) {
	m := e.AnonMap(nft.InetService.ID, 4, nft.IPv4Addr.ID, 4, [][]byte{{0, 80, 0, 0}}, [][]byte{s.to.To4()})
	e.Payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, nft.Reg1)
	e.Add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, m.Name)
		a.U32(unix.NFTA_LOOKUP_SET_ID, m.ID)
		a.U32(unix.NFTA_LOOKUP_SREG, nft.Reg1)
		a.U32(unix.NFTA_LOOKUP_DREG, nft.Reg1)
	})
}

// lookedUp is the set a rule's lookup names.
func lookedUp(rule []byte) string {
	list, _ := nfnl.Find(rule, unix.NFTA_RULE_EXPRESSIONS)
	for e := range nfnl.All(list) {
		if name, _ := nfnl.Find(e.Value, unix.NFTA_EXPR_NAME); string(name) != "lookup\x00" {
			continue
		}
		data, _ := nfnl.Find(e.Value, unix.NFTA_EXPR_DATA)
		if v, ok := nfnl.Find(data, unix.NFTA_LOOKUP_SET); ok {
			return strings.TrimRight(string(v), "\x00")
		}
	}
	return ""
}

// TestGets: a get answers the object or ENOENT; an interval map's get
// of a port answers the interval holding it; Validate-style batches
// (no commit) keep nothing.
func TestGets(t *testing.T) {
	k := nfttest.New()
	if err := apply(k, skeleton, func(tx *nft.Tx) { tx.Add(element{set: "r", port: 1000, last: 1099, chain: "b"}) }); err != nil {
		t.Fatal(err)
	}
	get := func(typ int, attrs func(a *nfnl.Attrs)) error {
		var a nfnl.Attrs
		attrs(&a)
		_, err := k.GetOne(nfnl.Msg{Type: nfnl.NftType(typ), Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()})
		return err
	}
	elem := func(port int) func(a *nfnl.Attrs) {
		return func(a *nfnl.Attrs) {
			a.String(unix.NFTA_SET_ELEM_LIST_TABLE, "t").String(unix.NFTA_SET_ELEM_LIST_SET, "r")
			a.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
				a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
					nft.Value(a, unix.NFTA_SET_ELEM_KEY, []byte{unix.IPPROTO_TCP, 0, 0, 0, byte(port >> 8), byte(port), 0, 0})
				})
			})
		}
	}
	for _, tt := range []struct {
		name  string
		typ   int
		attrs func(a *nfnl.Attrs)
		found bool
	}{
		{"table", unix.NFT_MSG_GETTABLE, func(a *nfnl.Attrs) { a.String(unix.NFTA_TABLE_NAME, "t") }, true},
		{"missing table", unix.NFT_MSG_GETTABLE, func(a *nfnl.Attrs) { a.String(unix.NFTA_TABLE_NAME, "x") }, false},
		{"chain", unix.NFT_MSG_GETCHAIN, func(a *nfnl.Attrs) { a.String(unix.NFTA_CHAIN_TABLE, "t").String(unix.NFTA_CHAIN_NAME, "a") }, true},
		{"missing chain", unix.NFT_MSG_GETCHAIN, func(a *nfnl.Attrs) { a.String(unix.NFTA_CHAIN_TABLE, "t").String(unix.NFTA_CHAIN_NAME, "x") }, false},
		{"set", unix.NFT_MSG_GETSET, func(a *nfnl.Attrs) { a.String(unix.NFTA_SET_TABLE, "t").String(unix.NFTA_SET_NAME, "r") }, true},
		{"a port inside an interval", unix.NFT_MSG_GETSETELEM, elem(1050), true},
		{"a port past it", unix.NFT_MSG_GETSETELEM, elem(1100), false},
	} {
		if err := get(tt.typ, tt.attrs); (err == nil) != tt.found || err != nil && !nft.IsNotFound(err) {
			t.Errorf("%s: %v, found want %v", tt.name, err, tt.found)
		}
	}
	tx := nft.NewTx(nft.IPv4, "t")
	tx.Add(&nft.Chain{Name: "c"})
	msgs, _ := tx.Messages()
	if err := k.Batch(msgs, false); err != nil {
		t.Fatal(err)
	}
	if err := get(unix.NFT_MSG_GETCHAIN, func(a *nfnl.Attrs) { a.String(unix.NFTA_CHAIN_TABLE, "t").String(unix.NFTA_CHAIN_NAME, "c") }); !nft.IsNotFound(err) {
		t.Errorf("a chain of a batch not committed: %v", err)
	}
	k.Flush()
	if err := get(unix.NFT_MSG_GETTABLE, func(a *nfnl.Attrs) { a.String(unix.NFTA_TABLE_NAME, "t") }); !nft.IsNotFound(err) {
		t.Errorf("a table after Flush: %v", err)
	}
}
