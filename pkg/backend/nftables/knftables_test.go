package nftables

import (
	"net"
	"strconv"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// The objects as knftables' own types: the test's oracle for Tx.Text,
// which writes them as knftables does without linking it into the plugin.
type knftObject interface{ nft(tx *Tx) knftables.Object }

func (v tableObj) nft(*Tx) knftables.Object {
	return &knftables.Table{Comment: knftables.PtrTo(v.comment)}
}

func (v chainObj) nft(*Tx) knftables.Object {
	c := &knftables.Chain{Name: v.name}
	if v.comment != "" {
		c.Comment = knftables.PtrTo(v.comment)
	}
	if v.base != nil {
		c.Type = knftables.PtrTo(knftables.BaseChainType(v.base.typ))
		c.Hook = knftables.PtrTo(knftables.BaseChainHook(v.base.hook))
		c.Priority = knftables.PtrTo(knftables.BaseChainPriority(strconv.Itoa(int(v.base.prio))))
	}
	return c
}

func (v mapObj) nft(tx *Tx) knftables.Object {
	m := &knftables.Map{Name: v.name, Type: mapType(tx.Family, v.addr)}
	if v.interval {
		m.Flags = []knftables.SetFlag{knftables.IntervalFlag}
	}
	return m
}

func (v elemObj) nft(*Tx) knftables.Object {
	e := &knftables.Element{Map: v.key.Map(), Key: v.key.Fields()}
	switch {
	case v.chain == "":
	case v.key.Flat:
		ip, port := target(v.to)
		e.Comment, e.Value = knftables.PtrTo(flatComment(v.chain, v.srcs)), []string{ip.String(), strconv.Itoa(port)}
	default:
		e.Value = []string{"goto " + v.chain}
	}
	return e
}

func (v dnatMapObj) nft(tx *Tx) knftables.Object {
	key := "inet_proto . inet_service"
	if v.addr {
		key = addrWord(tx.Family) + " . " + key
	}
	return &knftables.Map{Name: v.name, Type: key + " : " + addrWord(tx.Family) + " . inet_service"}
}

func (v hairpinSetObj) nft(tx *Tx) knftables.Object {
	key := addrWord(tx.Family) + " . "
	if v.addr {
		key += addrWord(tx.Family) + " . "
	}
	return &knftables.Set{Name: hairpinSet(v.addr, v.ones), Type: key + "inet_proto . inet_service"}
}

func (ownersMapObj) nft(*Tx) knftables.Object {
	return &knftables.Map{Name: OwnersMap, Type: "ipv6_addr : verdict"}
}

func (v ownerObj) nft(*Tx) knftables.Object {
	return &knftables.Element{Map: OwnersMap, Key: []string{net.IP(ownerKey(v.chain)).String()}, Value: []string{"goto " + v.chain}}
}

func (v hairpinObj) nft(*Tx) knftables.Object {
	e := &knftables.Element{Set: v.h.set(), Key: append([]string{parsePrefix(v.h.Src).IP.String()}, v.h.Key.Fields()...)}
	if v.h.Chain != "" {
		e.Comment = knftables.PtrTo(v.h.Chain)
	}
	return e
}

func (v *Rule) nft(tx *Tx) knftables.Object {
	r := &knftables.Rule{Chain: v.Chain, Rule: v.Text(tx.Family)}
	if v.Comment != "" {
		r.Comment = knftables.PtrTo(v.Comment)
	}
	if v.Handle != 0 {
		r.Handle = knftables.PtrTo(int(v.Handle))
	}
	return r
}

// knftText is tx as knftables writes it.
func knftText(t *testing.T, tx *Tx) string {
	t.Helper()
	kt := knftables.NewFake(knftables.Family(nftFamily(tx.Family)), tx.Table).NewTransaction()
	for _, o := range tx.ops {
		obj := o.obj.(knftObject).nft(tx)
		switch o.verb {
		case opAdd:
			kt.Add(obj)
		case opCreate:
			kt.Create(obj)
		case opFlush:
			kt.Flush(obj)
		case opDelete:
			kt.Delete(obj)
		}
	}
	return kt.String()
}

// TestTextAsKnftables: every kind of object under every verb the backend
// uses, and the transactions of the golden files, written as knftables
// writes them (a validation error of knftables' would show as "# ERROR").
func TestTextAsKnftables(t *testing.T) {
	var txs []*Tx
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		for _, p := range []*plan.Plan{build(f, nil), build(f, smallRanges),
			build(f, func(r *plan.Request) { r.Masquerade.Enabled = false }),
			build(f, func(r *plan.Request) {
				r.Masquerade.All, r.Masquerade.MarkBit = true, 5
				r.ConditionsV4 = []string{"ip saddr != 203.0.113.0/24"}
			})} {
			skel := newTx(f)
			addSkeleton(skel, p, lengthsOf(nil, p))
			txs = append(txs, skel, fastAddTx(p), fastDelTx(f, ChainName(p.Owner), Keys(p)))
			if isFlat(p) {
				txs = append(txs, fastFlatTx(p, Keys(p)))
				sl := newTx(f)
				rewriteChain(sl, p, &ChainState{HasRecord: true, Owned: true})
				txs = append(txs, sl)
			}
		}
		verbs := newTx(f)
		k := Keys(build(f, smallRanges))
		for _, v := range []verb{opAdd, opCreate, opFlush, opDelete} {
			verbs.add(v, tableObj{comment: "portmap's \"table\""})
			verbs.add(v, chainObj{name: "plain"})
			verbs.add(v, chainObj{name: "commented", comment: "a comment"})
			verbs.add(v, chainObj{name: "based", base: &guardBase, comment: "guard"})
			verbs.add(v, mapObj{name: "m", addr: true, interval: true})
			if v == opAdd || v == opCreate { // an element is added with its verdict
				verbs.add(v, elemObj{key: k[0], chain: "CNI-DN-x"})
			}
		}
		verbs.add(opDelete, elemObj{key: k[len(k)-1]})
		fk := Keys(build(f, nil))
		hp := wantedHairpins(build(f, nil), fk)
		for _, v := range []verb{opAdd, opCreate, opDelete} {
			verbs.add(v, dnatMapObj{name: HostIPDNATMap, addr: true})
			verbs.add(v, hairpinSetObj{ones: 24})
			if v != opFlush {
				verbs.add(v, ownerObj{"dn-0123456789abcdef-fedcba9876543210"})
			}
			if v != opDelete && v != opFlush {
				verbs.add(v, ownersMapObj{})
			}
			verbs.add(v, hairpinObj{hp[0]})
			if v != opDelete {
				verbs.add(v, elemObj{key: fk[0], chain: "dn-x", to: "192.0.2.2:80", srcs: []string{"192.0.2.0/24"}})
			}
		}
		verbs.add(opDelete, elemObj{key: fk[0]})
		verbs.add(opDelete, &Rule{Chain: "dispatch", Handle: 42})
		txs = append(txs, verbs)
	}
	for i, tx := range txs {
		if got, want := tx.Text(), knftText(t, tx); got != want {
			t.Errorf("transaction %d (%s):\n%s\nknftables writes\n%s", i, tx.Family, got, want)
		}
	}
}
