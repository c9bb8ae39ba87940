package iptables

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Memory is x_tables in memory, for tests without root: it applies
// iptables-restore payloads — all or nothing, failing on the first line
// the kernel would refuse (a chain that exists or is missing, a rule that
// is not there, a jump to nowhere, a chain still referenced) with
// iptables-restore's "line N failed" — and answers listings in the
// spelling of iptables -S. Kernel(table) is the view a backend gets.
// Trace follows a packet through the nat table.
type Memory struct {
	// mu makes each restore, listing and ensure one step, as the kernel
	// (and the xtables lock) do: the agent's units write concurrently.
	mu     sync.Mutex
	tables map[string]*xtable
	// Restores counts the payloads committed; Natives the native fast
	// path's transactions (AddChain).
	Restores, Natives int
	// Legacy makes the tables iptables-legacy's: not readable over
	// nf_tables netlink (Chains fails with ErrLegacy), not probed
	// (Writable answers nfnl.ErrNoProbe).
	Legacy bool
	// NotWritable is Writable's answer on nf_tables.
	NotWritable error
}

// xtable is one table: its chains in creation order, each rule as its
// tokens after the chain name.
type xtable struct {
	order []string
	rules map[string][][]string
}

// NewMemory returns an empty nat and filter table.
func NewMemory() *Memory {
	m := &Memory{tables: map[string]*xtable{}}
	for t := range builtins {
		m.table(t)
	}
	return m
}

func (m *Memory) table(name string) *xtable {
	t := m.tables[name]
	if t == nil {
		t = &xtable{rules: map[string][][]string{}}
		for _, c := range builtins[name] {
			t.order, t.rules[c] = append(t.order, c), nil
		}
		m.tables[name] = t
	}
	return t
}

func (m *Memory) clone() *Memory {
	c := &Memory{tables: map[string]*xtable{}, Restores: m.Restores, Natives: m.Natives}
	for n, t := range m.tables {
		ct := &xtable{order: slices.Clone(t.order), rules: map[string][][]string{}}
		for ch, rs := range t.rules {
			ct.rules[ch] = slices.Clone(rs)
		}
		c.tables[n] = ct
	}
	return c
}

// FlushTable is `iptables -t table -F`: every chain emptied, user chains
// kept.
func (m *Memory) FlushTable(table string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.table(table)
	for c := range t.rules {
		t.rules[c] = nil
	}
}

func (t *xtable) has(chain string) bool { _, ok := t.rules[chain]; return ok }

// refs counts the rules that jump to chain.
func (t *xtable) refs(chain string) int {
	n := 0
	for _, rs := range t.rules {
		for _, r := range rs {
			if jumpOf(r) == chain {
				n++
			}
		}
	}
	return n
}

func (t *xtable) find(chain string, rule []string) int {
	return slices.IndexFunc(t.rules[chain], func(r []string) bool { return slices.Equal(r, rule) })
}

// apply runs one payload line on the table; false when the kernel would
// refuse it.
func (t *xtable) apply(line string) bool {
	if name, ok := strings.CutPrefix(line, ":"); ok {
		name, _, _ = strings.Cut(name, " ")
		if !t.has(name) {
			t.order = append(t.order, name)
		}
		t.rules[name] = nil
		return true
	}
	tok := SplitRule(line)
	if len(tok) < 2 {
		return false
	}
	cmd, chain, rule := tok[0], tok[1], tok[2:]
	switch cmd {
	case "-N":
		if t.has(chain) {
			return false
		}
		t.order, t.rules[chain] = append(t.order, chain), nil
		return true
	case "-X":
		if !t.has(chain) || len(t.rules[chain]) > 0 || t.refs(chain) > 0 || slices.Contains(builtins[Table], chain) {
			return false
		}
		delete(t.rules, chain)
		t.order = slices.DeleteFunc(t.order, func(c string) bool { return c == chain })
		return true
	case "-F":
		if !t.has(chain) {
			return false
		}
		t.rules[chain] = nil
		return true
	}
	if !t.has(chain) {
		return false
	}
	switch cmd {
	case "-C":
		return t.find(chain, rule) >= 0
	case "-D":
		i := t.find(chain, rule)
		if i < 0 {
			return false
		}
		t.rules[chain] = slices.Delete(t.rules[chain], i, i+1)
		return true
	case "-A", "-I":
		pos := len(t.rules[chain])
		if cmd == "-I" {
			pos = 0
			if len(rule) > 0 {
				if n, err := strconv.Atoi(rule[0]); err == nil {
					pos, rule = min(n-1, len(t.rules[chain])), rule[1:]
				}
			}
		}
		if j := jumpOf(rule); j != "" && !targets[j] && !t.has(j) {
			return false
		}
		t.rules[chain] = slices.Insert(t.rules[chain], pos, slices.Clone(rule))
		return true
	}
	return false
}

// restore applies payload to a copy and commits it when every line went
// through.
func (m *Memory) restore(payload []byte, commit bool) error {
	c := m.clone()
	if err := c.apply(payload); err != nil {
		return err
	}
	if commit {
		m.tables = c.tables
		m.Restores++
	}
	return nil
}

// apply runs payload's lines on m, stopping at the first that fails.
func (c *Memory) apply(payload []byte) error {
	var t *xtable
	for i, line := range strings.Split(strings.TrimRight(string(payload), "\n"), "\n") {
		ok := true
		switch {
		case strings.HasPrefix(line, "*"):
			t = c.table(line[1:])
		case line == "COMMIT" || line == "" || strings.HasPrefix(line, "#"):
		case t == nil:
			ok = false
		default:
			ok = t.apply(line)
		}
		if !ok {
			return &restoreFailure{Output: fmt.Sprintf("iptables-restore: line %d failed", i+1),
				Err: errors.New("iptables-restore: exit status 1"), Refused: true}
		}
	}
	return nil
}

// Kernel is the view of table a backend gets: restores reach every table,
// listings and ensures this one.
func (m *Memory) Kernel(table string) Kernel { return &memKernel{m, table} }

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
		out = append(out, "-A "+chain+" "+quoteArgs(r))
	}
	return out, nil
}

// ListTable prints the table as iptables -S does: policies, chains, rules.
func (k *memKernel) ListTable() ([]string, error) {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	t := k.m.table(k.table)
	var out []string
	for _, c := range builtins[k.table] {
		out = append(out, "-P "+c+" ACCEPT")
	}
	for _, c := range t.order {
		if !slices.Contains(builtins[k.table], c) {
			out = append(out, "-N "+c)
		}
	}
	for _, c := range t.order {
		for _, r := range t.rules[c] {
			out = append(out, "-A "+c+" "+quoteArgs(r))
		}
	}
	return out, nil
}

func (k *memKernel) EnsureChain(c Chain) error {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	t := k.m.table(tableOf(Rule{Table: c.Table}))
	if !t.has(c.Name) {
		t.order, t.rules[c.Name] = append(t.order, c.Name), nil
	}
	return nil
}

func (k *memKernel) EnsureRule(r Rule) error {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	t := k.m.table(tableOf(r))
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
	if !t.apply(cmd + r.Chain + " " + quoteArgs(r.Args())) {
		return unix.ENOENT
	}
	return nil
}

// AddChain does what the native fast path does, as the real kernel
// does it on iptables-nft: rules it does not write fail with
// errNotNative, and it applies them as one restore would (a missing
// witness or an existing chain refuses it), counted in Natives.
func (k *memKernel) AddChain(witness, chain string, rules, entries []Rule, jumps ...string) error {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	if k.m.Legacy || k.table != Table {
		return ErrLegacy
	}
	if _, err := addChainMsgs(plan.IPv4, witness, chain, rules, entries, jumps...); err != nil {
		if _, err6 := addChainMsgs(plan.IPv6, witness, chain, rules, entries, jumps...); err6 != nil {
			return err
		}
	}
	pl := newPayload()
	if witness != "" {
		pl.line("-F "+witness, "witness")
	}
	pl.line("-N "+chain, "chain")
	for _, r := range rules {
		pl.rule("-A", r)
	}
	for i := len(entries) - 1; i >= 0; i-- {
		pl.rule("-I", entries[i])
	}
	c := k.m.clone()
	if err := c.apply(pl.bytes()); err != nil {
		return err
	}
	k.m.tables = c.tables
	k.m.Natives++
	return nil
}

// memExprs is what nf_tables would hold for a rule of chain, as
// native.go writes it (either family); nil for a rule it does not write,
// which the real kernel's dump would not match either.
func memExprs(args []string, chain, jump string) []byte {
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		r := parseRule(args)
		r.Chain = chain
		if e, _, _, err := encodeRule(f, r, jumpSet(chain, []string{jump})); err == nil {
			return e
		}
	}
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
	ct.rules[parent] = slices.DeleteFunc(ct.rules[parent], func(r []string) bool { return jumpOf(r) == chain })
	ct.rules[chain] = nil
	if !ct.apply("-X " + chain) {
		return true, unix.EBUSY
	}
	k.m.tables = c.tables
	return true, nil
}

// Chains summarizes chains as nf_tables netlink would, unless the tables
// are legacy.
func (k *memKernel) Chains(table string, names []string, rules bool) (map[string]ChainSummary, error) {
	k.m.mu.Lock()
	defer k.m.mu.Unlock()
	if k.m.Legacy {
		return nil, ErrLegacy
	}
	t := k.m.table(table)
	out := map[string]ChainSummary{}
	for _, name := range names {
		if !t.has(name) {
			continue
		}
		if !rules {
			out[name] = ChainSummary{}
			continue
		}
		s := ChainSummary{Rules: len(t.rules[name]), Refs: t.refs(name)}
		for _, r := range t.rules[name] {
			to := jumpOf(r)
			if to != "" && !targets[to] {
				s.Jumps = append(s.Jumps, to)
			}
			s.Exprs = append(s.Exprs, memExprs(r, name, to))
		}
		out[name] = s
	}
	return out, nil
}
