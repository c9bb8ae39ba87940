package nftables

import (
	"net/netip"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// The objects as knftables' own types: the test's oracle for Tx.Text,
// which writes them as knftables does without linking it into the plugin.
type knftObject interface {
	nft(tx *nft.Tx) knftables.Object
}

func (v Element) nft(tx *nft.Tx) knftables.Object { return nfttest.Object(tx, v.element(tx.Family)) }

func (v ownerObj) nft(tx *nft.Tx) knftables.Object { return nfttest.Object(tx, v.element()) }

func (v hairpinObj) nft(tx *nft.Tx) knftables.Object { return nfttest.Object(tx, v.element(tx.Family)) }

// knftText is tx as knftables writes it.
func knftText(t *testing.T, tx *nft.Tx) string {
	t.Helper()
	return nfttest.Knftables(tx, func(tx *nft.Tx, obj nft.Object) knftables.Object { return obj.(knftObject).nft(tx) })
}

// TestTextAsKnftables: every kind of object under every verb the backend
// uses, and the transactions of the golden files, written as knftables
// writes them (a validation error of knftables' would show as "# ERROR").
func TestTextAsKnftables(t *testing.T) {
	var txs []*nft.Tx
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		for _, p := range []*plan.Plan{build(f, nil), build(f, inChain(func(*plan.Request) {})), build(f, smallRanges),
			build(f, func(r *plan.Request) { r.Masquerade.Enabled = false }),
			build(f, func(r *plan.Request) {
				r.Masquerade.All, r.Masquerade.MarkBit = true, 5
				r.ConditionsV4 = []string{"ip saddr != 203.0.113.0/24"}
			})} {
			skel := newTx(f)
			addSkeletonOf(skel, p)
			keys := layoutOf(p).keys
			for i := range keys {
				keys[i] = keys[i].port() // as a chain holds them: the DEL fast path's
			}
			l := layoutOf(p)
			sl := newTx(f) // the slow path's, over a chain of either shape
			l.rewriteChain(sl, &ChainState{HasClaims: true, Owned: true})
			txs = append(txs, skel, l.create(), fastDelTx(f, ChainName(p.Owner), keys), sl)
		}
		verbs := newTx(f)
		add := func(v nft.Verb, obj nft.Object) {
			map[nft.Verb]func(nft.Object){nft.Add: verbs.Add, nft.Create: verbs.Create, nft.Flush: verbs.Flush, nft.Delete: verbs.Delete}[v](obj)
		}
		k := layoutOf(build(f, smallRanges)).keys
		for _, v := range []nft.Verb{nft.Add, nft.Create, nft.Flush, nft.Delete} {
			add(v, &nft.Table{Comment: "portmap's \"table\""})
			add(v, &nft.Chain{Name: "plain"})
			add(v, &nft.Chain{Name: "commented", Comment: "a comment"})
			add(v, &nft.Chain{Name: "based", Base: &guardBase, Comment: "guard"})
			add(v, &nft.Set{Name: "m", Key: keyTypes(nft.Family(f), true), Data: []nft.Type{nft.Verdict}, Interval: true})
			if v == nft.Add || v == nft.Create { // an element is added with its verdict
				add(v, Element{Key: k[0], Chain: "CNI-DN-x"})
			}
		}
		verbs.Delete(Element{Key: k[len(k)-1]})
		fk := layoutOf(build(f, nil)).keys
		hp := layoutOf(build(f, nil)).hairpins
		for _, v := range []nft.Verb{nft.Add, nft.Create, nft.Delete} {
			add(v, dnatMapSet(nft.Family(f), hostIPDNATMap, true))
			add(v, hairpinSetOf(nft.Family(f), false, 24))
			if v != nft.Flush {
				add(v, ownerObj{"dn-0123456789abcdef-fedcba9876543210"})
			}
			if v != nft.Delete && v != nft.Flush {
				add(v, ownersSet())
			}
			add(v, hairpinObj{hp[0]})
			if v != nft.Delete {
				to := netip.MustParseAddrPort("192.0.2.2:80")
				if f == plan.IPv6 {
					to = netip.MustParseAddrPort("[2001:db8::2]:80")
				}
				add(v, Element{Key: fk[0], Chain: "dn-x", To: to, Srcs: []string{"192.0.2.0/24"}})
			}
		}
		verbs.Delete(Element{Key: fk[0]})
		verbs.Delete(&nft.Rule{Chain: "dispatch", Handle: 42})
		txs = append(txs, verbs)
	}
	for i, tx := range txs {
		if got, want := tx.Text(), knftText(t, tx); got != want {
			t.Errorf("transaction %d (%s):\n%s\nknftables writes\n%s", i, tx.Family, got, want)
		}
	}
}
