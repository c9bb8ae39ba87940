// Package xttest is x_tables in memory behind xt.Kernel, for tests
// without root: the iptables backend runs on it as on a node, only the
// tools and the socket replaced. No binary links it.
package xttest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/portmap-dev/portmap/pkg/xt"
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
	// path's transactions (AddChain); Ensures the chains and rules
	// ensured one by one (on a node, a process or two each).
	Restores, Natives, Ensures int
	// Legacy makes the tables iptables-legacy's: not readable over
	// nf_tables netlink (Chains fails with ErrLegacy), not probed
	// (Writable answers nfnl.ErrNoProbe).
	Legacy bool
	// NotWritable is Writable's answer on nf_tables.
	NotWritable error
	// native is the expressions the native writer writes for a rule of
	// chain spelled args that may jump to jumps, or xt.ErrNotNative.
	native func(chain string, args, jumps []string) ([]byte, error)
}

// xtable is one table: its chains in creation order, each rule as its
// tokens after the chain name.
type xtable struct {
	name  string
	order []string
	rules map[string][][]string
}

// New returns an empty nat and filter table. native is what the native
// writer writes for a rule of chain spelled args (iptables -S tokens after
// the chain) that may jump to jumps, or xt.ErrNotNative for a rule it does
// not write (xt.NativeExprs): AddChain takes the rules it writes,
// and Chains answers with their expressions, as iptables-nft does.
func New(native func(chain string, args, jumps []string) ([]byte, error)) *Memory {
	m := &Memory{tables: map[string]*xtable{}, native: native}
	for t := range xt.Builtins {
		m.table(t)
	}
	return m
}

func (m *Memory) table(name string) *xtable {
	t := m.tables[name]
	if t == nil {
		t = &xtable{name: name, rules: map[string][][]string{}}
		for _, c := range xt.Builtins[name] {
			t.order, t.rules[c] = append(t.order, c), nil
		}
		m.tables[name] = t
	}
	return t
}

func (m *Memory) clone() *Memory {
	c := &Memory{tables: map[string]*xtable{}, Restores: m.Restores, Natives: m.Natives, Ensures: m.Ensures, native: m.native}
	for n, t := range m.tables {
		ct := &xtable{name: n, order: slices.Clone(t.order), rules: map[string][][]string{}}
		for ch, rs := range t.rules {
			ct.rules[ch] = slices.Clone(rs)
		}
		c.tables[n] = ct
	}
	return c
}

// Flush empties every table and deletes its chains but the built-in
// ones, as `iptables -t TABLE -F` and `-X` of each table would.
func (m *Memory) Flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tables = map[string]*xtable{}
	for t := range xt.Builtins {
		m.table(t)
	}
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
			if xt.JumpOf(r) == chain {
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
	tok := xt.SplitRule(line)
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
		if !t.has(chain) || len(t.rules[chain]) > 0 || t.refs(chain) > 0 || slices.Contains(xt.Builtins[t.name], chain) {
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
		if j := xt.JumpOf(rule); j != "" && !xt.Targets[j] && !t.has(j) {
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
			return &xt.RestoreError{Output: fmt.Sprintf("iptables-restore: line %d failed", i+1),
				Err: errors.New("iptables-restore: exit status 1"), Refused: true}
		}
	}
	return nil
}
