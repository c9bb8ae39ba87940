package nftables

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// listed splits nfttest's listing into its blocks ("chain c", "map m")
// and their lines, trimmed.
func listed(text string) map[string][]string {
	out := map[string][]string{}
	var block string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "table "):
			block = ""
		case strings.HasSuffix(l, " {"):
			block = strings.TrimSuffix(l, " {")
		case l == "}" || l == "" || block == "":
		default:
			out[block] = append(out[block], l)
		}
	}
	return out
}

// expected is what the transactions say the table holds once applied on
// an empty kernel, block by block as nfttest lists it.
func expected(f nft.Family, txs ...*nft.Tx) map[string][]string {
	out := map[string][]string{}
	for _, tx := range txs {
		for _, op := range tx.Ops() {
			var b strings.Builder
			op.Obj.Text(tx, op.Verb, &b)
			switch o := op.Obj.(type) {
			case *nft.Chain:
				block := "chain " + o.Name
				if op.Verb == nft.Flush {
					out[block] = slices.DeleteFunc(out[block], func(l string) bool { return !strings.HasPrefix(l, "comment ") && !strings.HasPrefix(l, "type ") })
					continue
				}
				if _, ok := out[block]; ok {
					continue
				}
				out[block] = []string{}
				if o.Comment != "" {
					out[block] = append(out[block], `comment "`+o.Comment+`"`)
				}
				if o.Base != nil {
					out[block] = append(out[block], "type "+o.Base.Type+" hook "+o.Base.Hook+" priority "+strconv.Itoa(int(o.Base.Priority)))
				}
			case *nft.Set:
				kind := "set "
				if o.IsMap() {
					kind = "map "
				}
				if _, ok := out[kind+o.Name]; ok {
					continue
				}
				out[kind+o.Name] = []string{"type " + o.TypeText()}
				if o.Interval {
					out[kind+o.Name] = append(out[kind+o.Name], "flags interval")
				}
			case *nft.Rule:
				// conditions: the kernel in memory holds the rule without them
				r := *o
				r.Stmts = slices.DeleteFunc(slices.Clone(o.Stmts), func(s nft.Stmt) bool { _, ok := s.(nft.Conditions); return ok })
				line := r.StmtText(f)
				if o.Comment != "" {
					line += ` comment "` + o.Comment + `"`
				}
				out["chain "+o.Chain] = append(out["chain "+o.Chain], line)
			case *nft.Table:
			default: // an element: "add element ip cni_portmap <set> { <element> }"
				fields := strings.Fields(b.String())
				el := strings.TrimSuffix(strings.TrimSpace(b.String()[strings.Index(b.String(), "{ ")+2:]), " }")
				for _, kind := range []string{"map ", "set "} {
					if lines, ok := out[kind+fields[4]]; ok {
						if op.Verb == nft.Delete {
							out[kind+fields[4]] = slices.DeleteFunc(lines, func(l string) bool { return strings.HasPrefix(l, el) })
						} else {
							out[kind+fields[4]] = append(lines, el)
						}
					}
				}
			}
		}
	}
	return out
}

// TestLayoutListsAsItsText: the skeleton and an attachment of each shape
// (flat, IPv6, without masquerade, a chain with another mark bit and
// masqAll, a chain with a DNAT map, ranges), written as netlink to
// nf_tables in memory and listed back from the kernel's expressions,
// read as their transactions' nft text says, block by block: every base
// chain, rule, map and element, the layout's own lookups (dispatch,
// hairpin, DNAT maps, the guard's drop) among them.
func TestLayoutListsAsItsText(t *testing.T) {
	many := func(r *plan.Request) {
		r.Masquerade.MarkBit = 5
		for i := range 10 {
			r.Mappings.Add(plan.Mapping{HostPort: 7000 + 2*i, ContainerPort: 70 + i, Protocol: plan.TCP})
		}
	}
	for _, tc := range []struct {
		name string
		f    plan.Family
		mod  func(*plan.Request)
	}{
		{"flat", plan.IPv4, nil},
		{"flat-v6", plan.IPv6, nil},
		{"snat-off", plan.IPv4, func(r *plan.Request) { r.Masquerade.Enabled = false }},
		{"masqall-bit5", plan.IPv4, func(r *plan.Request) { r.Masquerade.All, r.Masquerade.MarkBit = true, 5 }},
		{"dnat-map", plan.IPv4, many},
		{"dnat-map-v6", plan.IPv6, many},
		{"ranges", plan.IPv4, smallRanges},
		{"ranges-v6", plan.IPv6, smallRanges},
		{"conditions", plan.IPv4, func(r *plan.Request) { r.ConditionsV4 = []string{`iifname != "lo"`} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := build(tc.f, tc.mod)
			skel := newTx(p.Family)
			addSkeletonOf(skel, p)
			l := layoutOf(p)
			add := l.create()
			if l.hasRanges() { // written under the lock, beside what shares its ports
				add = newTx(p.Family)
				l.rewriteChain(add, nil)
				place(add, l, nil, nil, io.Discard)
			}
			k := nfttest.New()
			for _, tx := range []*nft.Tx{skel, add} {
				if err := nft.Commit(k, tx, true); err != nil {
					t.Fatalf("%v\n%s", err, tx.Text())
				}
			}
			text, err := k.List()
			if err != nil {
				t.Fatal(err)
			}
			got, want := listed(text), expected(nft.Family(p.Family), skel, add)
			for block, lines := range want {
				g := got[block]
				if strings.HasPrefix(block, "map ") || strings.HasPrefix(block, "set ") {
					// the type and flags, then the elements sorted
					n := 1
					if len(lines) > 1 && lines[1] == "flags interval" {
						n = 2
					}
					lines = append(lines[:n:n], slices.Sorted(slices.Values(lines[n:]))...)
				}
				if strings.Join(g, "\n") != strings.Join(lines, "\n") {
					t.Errorf("%s lists:\n%s\nwant, as the transactions say:\n%s", block, strings.Join(g, "\n"), strings.Join(lines, "\n"))
				}
			}
			for block := range got {
				if _, ok := want[block]; !ok {
					t.Errorf("listed %s, which no transaction wrote", block)
				}
			}
		})
	}
}
