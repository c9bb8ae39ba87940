package nfttest

import (
	"net"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// blocks splits List's text into its blocks ("table ip t", "chain ip t
// c", "map ip t m") and their lines, trimmed.
func blocks(text string) map[string][]string {
	out := map[string][]string{}
	var table, block string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "table "):
			table = strings.TrimSuffix(l, " {")
			block = table
		case strings.HasSuffix(l, " {") && (strings.HasPrefix(l, "chain ") || strings.HasPrefix(l, "set ") || strings.HasPrefix(l, "map ")):
			kind, name, _ := strings.Cut(strings.TrimSuffix(l, " {"), " ")
			block = kind + " " + strings.TrimPrefix(table, "table ") + " " + name
		case l == "}" || l == "":
		default:
			out[block] = append(out[block], l)
		}
	}
	return out
}

// TestListReadsAsTheTextSays: every statement of pkg/nft, written as
// netlink and read back from the kernel's expressions, lists as its Text
// says, in both families; so do chains, sets, maps and their elements.
// What the kernel holds is nft text a test can read, and the two
// spellings of a statement are held to each other without root.
func TestListReadsAsTheTextSays(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			addr, prefix, odd, target := "192.0.2.1", "192.0.2.0/24", "198.51.96.0/20", net.ParseIP("192.0.2.2")
			if f == nft.IPv6 {
				addr, prefix, odd, target = "2001:db8::1", "2001:db8::/64", "2001:db8:8000::/33", net.ParseIP("2001:db8::2")
			}
			m := &nft.Set{Name: "ports", Key: []nft.Type{nft.InetProto, nft.InetService}, Data: []nft.Type{nft.Verdict}}
			r := &nft.Set{Name: "ranges", Key: []nft.Type{nft.InetProto, nft.InetService}, Data: []nft.Type{nft.Verdict}, Interval: true}
			d := &nft.Set{Name: "dnat", Key: []nft.Type{f.AddrType(), nft.InetProto, nft.InetService}, Data: []nft.Type{f.AddrType(), nft.InetService}}
			tx := nft.NewTx(f, "t")
			tx.Add(&nft.Table{Comment: "portmap"})
			tx.Add(&nft.Chain{Name: "pre", Base: &nft.BaseChain{Type: "nat", Hook: "prerouting", HookNum: 0, Priority: -100}})
			tx.Add(&nft.Chain{Name: "c", Comment: "net=n id=c1"})
			tx.Add(&nft.Chain{Name: "mark"})
			for _, s := range []*nft.Set{m, r, d} {
				tx.Add(s)
			}
			ip := func(s string) []byte {
				if f == nft.IPv4 {
					return net.ParseIP(s).To4()
				}
				return net.ParseIP(s).To16()
			}
			key := func(proto byte, port int) []byte { return []byte{proto, 0, 0, 0, byte(port >> 8), byte(port), 0, 0} }
			els := []*nft.Element{
				{Set: m, Key: key(6, 8080), Goto: "c", Comment: "net=n id=c1"},
				{Set: m, Key: key(17, 53), Goto: "c"},
				{Set: r, Key: key(6, 20000), KeyEnd: key(6, 20999), Goto: "c"},
				{Set: d, Key: append(ip(addr), key(6, 443)...), Data: append(ip(target.String()), 1, 187, 0, 0), Comment: "dn-1 " + prefix},
			}
			for _, e := range els {
				tx.Add(e)
			}
			rules := []*nft.Rule{
				{Chain: "pre", Stmts: []nft.Stmt{nft.FibLocal{}, nft.Jump{To: "c"}}},
				{Chain: "c", Stmts: []nft.Stmt{nft.Addr{Spec: prefix}, nft.Jump{To: "mark"}}, Comment: "hairpin"},
				{Chain: "c", Stmts: []nft.Stmt{nft.Addr{Spec: odd}, nft.Jump{To: "mark"}}},
				{Chain: "c", Stmts: []nft.Stmt{nft.Addr{Dst: true, Spec: addr}, nft.L4Proto{Name: "tcp"}, nft.DPort{Port: 8080}, nft.DNATTo(target, 80)}, Comment: "hostport tcp . 8080"},
				{Chain: "c", Stmts: []nft.Stmt{nft.L4Proto{Name: "udp"}, nft.DPort{Port: 20000, Last: 20999}, nft.DNATTo(target, 0)}},
				{Chain: "c", Stmts: []nft.Stmt{nft.L4Proto{Name: "sctp"}, nft.DPort{Port: 9}, nft.DNATTo(target, 9)}},
				{Chain: "mark", Stmts: []nft.Stmt{nft.MarkOr{Mark: 0x2000}}},
				{Chain: "mark", Stmts: []nft.Stmt{nft.MarkHas{Mark: 0x2000}, nft.Masquerade{}}},
			}
			for _, x := range rules {
				tx.Add(x)
			}
			k := New()
			if err := nft.Commit(k, tx, true); err != nil {
				t.Fatal(err)
			}
			text, err := k.List()
			if err != nil {
				t.Fatal(err)
			}
			got := blocks(text)
			name := f.String() + " t "
			want := map[string][]string{
				"table " + f.String() + " t": {`comment "portmap"`},
				"chain " + name + "pre":      {"type nat hook prerouting priority -100"},
				"chain " + name + "c":        {`comment "net=n id=c1"`},
				"map " + name + "ports":      {"type inet_proto . inet_service : verdict", `tcp . 8080 comment "net=n id=c1" : goto c`, "udp . 53 : goto c"},
				"map " + name + "ranges":     {"type inet_proto . inet_service : verdict", "flags interval", "tcp . 20000-20999 : goto c"},
				"map " + name + "dnat": {"type " + f.AddrType().Name + " . inet_proto . inet_service : " + f.AddrType().Name + " . inet_service",
					addr + ` . tcp . 443 comment "dn-1 ` + prefix + `" : ` + target.String() + " . 443"},
			}
			for _, x := range rules {
				line := x.StmtText(f)
				if x.Comment != "" {
					line += ` comment "` + x.Comment + `"`
				}
				want["chain "+name+x.Chain] = append(want["chain "+name+x.Chain], line)
			}
			for block, lines := range want {
				if strings.Join(got[block], "\n") != strings.Join(lines, "\n") {
					t.Errorf("%s lists:\n%s\nwant:\n%s", block, strings.Join(got[block], "\n"), strings.Join(lines, "\n"))
				}
			}
			if len(got) != len(want) {
				t.Errorf("listed blocks %d, want %d:\n%s", len(got), len(want), text)
			}
		})
	}
}

// TestListNamesWhatItDoesNotKnow: a rule of an expression the reader
// does not know fails the listing, naming it, instead of listing
// something else.
func TestListNamesWhatItDoesNotKnow(t *testing.T) {
	tx := nft.NewTx(nft.IPv4, "t")
	tx.Add(&nft.Table{})
	tx.Add(&nft.Chain{Name: "c"})
	tx.Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{quota{}}})
	k := New()
	if err := nft.Commit(k, tx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := k.List(); err == nil || !strings.Contains(err.Error(), `expression "quota"`) {
		t.Errorf("List of a quota rule: %v, want it named", err)
	}
}

// quota is a statement the reader does not know.
type quota struct{}

func (quota) Text(nft.Family) string { return "quota 1 mbytes" }
func (quota) Encode(e *nft.Exprs)    { e.Add("quota", func(*nfnl.Attrs) {}) }
