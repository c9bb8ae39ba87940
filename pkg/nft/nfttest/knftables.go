// Package nfttest holds what tests of pkg/nft's users share: the oracle
// for a transaction's text. No binary links it.
package nfttest

import (
	"strconv"

	"sigs.k8s.io/knftables"

	"github.com/portmap-dev/portmap/pkg/nft"
)

// Knftables is tx as knftables writes it: pkg/nft's objects as
// knftables' own types, and any other kind (a user's elements) as other
// makes it. Tests hold tx.Text to it.
func Knftables(tx *nft.Tx, other func(tx *nft.Tx, obj nft.Object) knftables.Object) string {
	kt := knftables.NewFake(knftables.Family(tx.Family.String()), tx.TableName).NewTransaction()
	for _, o := range tx.Ops() {
		obj := Object(tx, o.Obj)
		if obj == nil {
			obj = other(tx, o.Obj)
		}
		switch o.Verb {
		case nft.Add:
			kt.Add(obj)
		case nft.Create:
			kt.Create(obj)
		case nft.Flush:
			kt.Flush(obj)
		case nft.Delete:
			kt.Delete(obj)
		}
	}
	return kt.String()
}

// Object is obj as knftables' type, or nil for a kind pkg/nft does not
// define.
func Object(tx *nft.Tx, obj nft.Object) knftables.Object {
	switch v := obj.(type) {
	case *nft.Table:
		return &knftables.Table{Comment: knftables.PtrTo(v.Comment)}
	case *nft.Chain:
		c := &knftables.Chain{Name: v.Name}
		if v.Comment != "" {
			c.Comment = knftables.PtrTo(v.Comment)
		}
		if v.Base != nil {
			c.Type = knftables.PtrTo(knftables.BaseChainType(v.Base.Type))
			c.Hook = knftables.PtrTo(knftables.BaseChainHook(v.Base.Hook))
			c.Priority = knftables.PtrTo(knftables.BaseChainPriority(strconv.Itoa(int(v.Base.Priority))))
		}
		return c
	case *nft.Set:
		var flags []knftables.SetFlag
		if v.Interval {
			flags = []knftables.SetFlag{knftables.IntervalFlag}
		}
		if v.IsMap() {
			return &knftables.Map{Name: v.Name, Type: v.TypeText(), Flags: flags}
		}
		return &knftables.Set{Name: v.Name, Type: v.TypeText(), Flags: flags}
	case *nft.Element:
		e := &knftables.Element{Key: nft.Fields(v.Set.Key, v.Key, v.KeyEnd)}
		if v.Set.IsMap() {
			e.Map = v.Set.Name
		} else {
			e.Set = v.Set.Name
		}
		if v.Comment != "" {
			e.Comment = knftables.PtrTo(v.Comment)
		}
		switch {
		case v.Goto != "":
			e.Value = []string{"goto " + v.Goto}
		case v.Data != nil:
			e.Value = nft.Fields(v.Set.Data, v.Data, nil)
		}
		return e
	case *nft.Rule:
		r := &knftables.Rule{Chain: v.Chain, Rule: v.StmtText(tx.Family)}
		if v.Comment != "" {
			r.Comment = knftables.PtrTo(v.Comment)
		}
		if v.Handle != 0 {
			r.Handle = knftables.PtrTo(int(v.Handle))
		}
		return r
	}
	return nil
}
