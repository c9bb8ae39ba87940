package xttest

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// Kernel is the view of table a backend gets: restores reach every table,
// listings and ensures this one.
func (m *Memory) Kernel(table string) xt.Kernel { return &memKernel{m, table} }

type memKernel struct {
	m     *Memory
	table string
}

func (k *memKernel) Restore(payload []byte) error {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	return k.m.restore(payload, true)
}
func (k *memKernel) Test(payload []byte) error {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	return k.m.restore(payload, false)
}

// Writable is NotWritable's answer, or nfnl.ErrNoProbe for legacy tables.
func (k *memKernel) Writable() error {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	if k.m.Legacy {
		return nfnl.ErrNoProbe
	}
	return k.m.NotWritable
}

// ListChain prints one chain as iptables -S CHAIN does.
func (k *memKernel) ListChain(chain string) ([]string, error) {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	t := k.m.table(k.table)
	if !t.has(chain) {
		return nil, fmt.Errorf("iptables: chain %s: No chain/target/match by that name", chain)
	}
	out := []string{"-N " + chain}
	for _, r := range t.rules[chain] {
		out = append(out, "-A "+chain+" "+xt.QuoteArgs(r))
	}
	return out, nil
}

// ListTable prints the table as iptables -S does: policies, chains, rules.
func (k *memKernel) ListTable() ([]string, error) {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	t := k.m.table(k.table)
	var out []string
	for _, c := range xt.Builtins[k.table] {
		out = append(out, "-P "+c+" ACCEPT")
	}
	for _, c := range t.order {
		if !slices.Contains(xt.Builtins[k.table], c) {
			out = append(out, "-N "+c)
		}
	}
	for _, c := range t.order {
		for _, r := range t.rules[c] {
			out = append(out, "-A "+c+" "+xt.QuoteArgs(r))
		}
	}
	return out, nil
}

func (k *memKernel) EnsureChain(c xt.Chain) error {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	k.m.Ensures++
	t := k.m.table(xt.Rule{Table: c.Table}.TableName())
	if !t.has(c.Name) {
		t.order, t.rules[c.Name] = append(t.order, c.Name), nil
	}
	return nil
}

func (k *memKernel) EnsureRule(r xt.Rule) error {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	k.m.Ensures++
	t := k.m.table(r.TableName())
	if !t.has(r.Chain) {
		return unix.ENOENT
	}
	if t.find(r.Chain, r.Args()) >= 0 {
		return nil
	}
	cmd := "-A "
	if r.Insert {
		cmd = "-I "
	}
	if !t.apply(cmd + r.Chain + " " + xt.QuoteArgs(r.Args())) {
		return unix.ENOENT
	}
	return nil
}

// AddChain does what the native fast path does, as the real kernel
// does it on iptables-nft: a rule the native writer does not write fails
// with xt.ErrNotNative, and it applies them as one restore would (a
// missing marker or an existing chain refuses it), counted in Natives.
func (k *memKernel) AddChain(marker, chain string, rules, entries []xt.Rule, jumps ...string) error {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	if k.m.Legacy || k.table != xt.NAT {
		return xt.ErrLegacy
	}
	var pl strings.Builder
	pl.WriteString("*" + xt.NAT + "\n")
	if marker != "" {
		pl.WriteString("-F " + marker + "\n")
	}
	pl.WriteString("-N " + chain + "\n")
	line := func(cmd string, r xt.Rule) error {
		if _, err := k.m.native(chain, r.Args(), append([]string{chain}, jumps...)); err != nil {
			return err
		}
		pl.WriteString(cmd + " " + r.Chain + " " + xt.QuoteArgs(r.Args()) + "\n")
		return nil
	}
	for _, r := range rules {
		if err := line("-A", r); err != nil {
			return err
		}
	}
	for i := len(entries) - 1; i >= 0; i-- {
		if err := line("-I", entries[i]); err != nil {
			return err
		}
	}
	pl.WriteString("COMMIT\n")
	c := k.m.clone()
	if err := c.apply([]byte(pl.String())); err != nil {
		return err
	}
	k.m.tables = c.tables
	k.m.Natives++
	return nil
}

// Unlink deletes chain and parent's jumps to it in one step, as the
// netlink DEL does on iptables-nft.
func (k *memKernel) Unlink(parent, chain string) (bool, error) {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	t := k.m.table(k.table)
	if !t.has(chain) {
		return false, nil
	}
	c := k.m.clone()
	ct := c.table(k.table)
	ct.rules[parent] = slices.DeleteFunc(ct.rules[parent], func(r []string) bool { return xt.JumpOf(r) == chain })
	ct.rules[chain] = nil
	if !ct.apply("-X " + chain) {
		return true, unix.EBUSY
	}
	k.m.tables = c.tables
	return true, nil
}

// Chains summarizes chains as nf_tables netlink would, unless the tables
// are legacy: a rule the native writer does not write has nil Exprs,
// which the real kernel's dump would not match either.
func (k *memKernel) Chains(table string, names []string, rules bool) (map[string]xt.ChainSummary, error) {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	if k.m.Legacy {
		return nil, xt.ErrLegacy
	}
	t := k.m.table(table)
	out := map[string]xt.ChainSummary{}
	for _, name := range names {
		if !t.has(name) {
			continue
		}
		if !rules {
			out[name] = xt.ChainSummary{}
			continue
		}
		s := xt.ChainSummary{Rules: len(t.rules[name]), Refs: t.refs(name)}
		for _, r := range t.rules[name] {
			to := xt.JumpOf(r)
			if to != "" && !xt.Targets[to] {
				s.Jumps = append(s.Jumps, to)
			}
			e, _ := k.m.native(name, r, []string{to})
			s.Exprs = append(s.Exprs, e)
		}
		out[name] = s
	}
	return out, nil
}
