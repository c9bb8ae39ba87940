package nftables

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Memory is nf_tables in memory, for tests without root: it applies a
// transaction's operations to the tables it keeps, all or nothing, with
// the errors the kernel gives for them (EEXIST for an object that exists
// or a key another verdict holds, ENOENT for a missing table, chain, map,
// element or jump target, EBUSY for a chain still referenced or holding
// rules), and answers the backend's reads from them. A rule is kept as
// the netlink attributes the kernel would get and read back through the
// decoder the netlink reader uses, so Memory is no third reader of our
// rules. Trace follows a packet through what it holds.
type Memory struct {
	// mu makes each transaction and read one step, as the kernel does:
	// the agent's units of both families run at once.
	mu         sync.Mutex
	tables     map[memKey]*memTable
	nextHandle uint64
	// Committed counts the transactions applied.
	Committed int
	// NotWritable is Writable's answer: nil, an error, or
	// nfnl.ErrNoProbe for a kernel before Linux 6.3.
	NotWritable error
}

var _ Kernel = (*Memory)(nil)

type memKey struct {
	f    plan.Family
	name string
}

type memTable struct {
	comment string
	chains  map[string]*memChain
	maps    map[string]map[string]string // map -> Key.ID() -> chain of the verdict, or a flat key's comment
	targets map[string]string            // a flat key's ID -> its target
	srcs    map[string][]string          // a flat key's ID -> the sources its comment names
	// hairpins are the hairpin sets (flat.go): set -> Hairpin.ID() -> it
	hairpins map[string]map[string]Hairpin
}

func newMemTable(comment string) *memTable {
	return &memTable{comment: comment, chains: map[string]*memChain{}, maps: map[string]map[string]string{},
		targets: map[string]string{}, srcs: map[string][]string{}, hairpins: map[string]map[string]Hairpin{}}
}

type memChain struct {
	comment string
	base    *baseChain
	rules   []RuleState
	// conditions marks rules holding conditionsV4/V6 (nft syntax), which
	// Trace takes as matching.
	conditions []bool
}

// FlushRuleset empties this in-memory kernel, as `nft flush ruleset`
// would the real one: every table gone. It touches no host state.
func (m *Memory) FlushRuleset() { m.mu.Lock(); defer m.mu.Unlock(); m.tables = map[memKey]*memTable{} }

// NewMemory returns an empty nf_tables.
func NewMemory() *Memory { return &Memory{tables: map[memKey]*memTable{}} }

// Apply commits tx, or nothing when an operation fails.
func (m *Memory) Apply(tx *Tx) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	next, err := m.simulate(tx)
	if err != nil {
		return err
	}
	m.tables, m.nextHandle = next.tables, next.nextHandle
	m.Committed++
	return nil
}

// Validate checks tx as Apply would, committing nothing.
func (m *Memory) Validate(tx *Tx) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.simulate(tx)
	return err
}

// Writable is nil unless NotWritable says otherwise.
func (m *Memory) Writable(plan.Family) error { return m.NotWritable }

// simulator is every object kind: it applies a verb to the in-memory
// kernel, with the errno the kernel would answer. It is not part of
// object, so that the plugin's binary, which has no in-memory kernel,
// carries none of it.
type simulator interface {
	simulate(s *memTx, v verb) error
}

// memTx is a transaction being applied to a copy of the tables.
type memTx struct {
	*Memory
	tx *Tx
}

func (m *Memory) simulate(tx *Tx) (*Memory, error) {
	c := &Memory{tables: map[memKey]*memTable{}, nextHandle: m.nextHandle}
	for k, t := range m.tables {
		c.tables[k] = t.clone()
	}
	s := &memTx{c, tx}
	for _, o := range tx.ops {
		if err := o.obj.(simulator).simulate(s, o.verb); err != nil {
			return nil, &Error{Op: strings.TrimSpace((&Tx{Family: tx.Family, Table: tx.Table, ops: []op{o}}).Text()), Err: err}
		}
	}
	return c, nil
}

func (t *memTable) clone() *memTable {
	c := newMemTable(t.comment)
	for k, v := range t.targets {
		c.targets[k] = v
	}
	for k, v := range t.srcs {
		c.srcs[k] = v
	}
	for n, hs := range t.hairpins {
		c.hairpins[n] = map[string]Hairpin{}
		for id, h := range hs {
			c.hairpins[n][id] = h
		}
	}
	for n, ch := range t.chains {
		cc := *ch
		cc.rules = append([]RuleState(nil), ch.rules...)
		cc.conditions = append([]bool(nil), ch.conditions...)
		c.chains[n] = &cc
	}
	for n, els := range t.maps {
		c.maps[n] = map[string]string{}
		for k, v := range els {
			c.maps[n][k] = v
		}
	}
	return c
}

// table is the transaction's table; ENOENT when it does not exist.
func (s *memTx) table() (*memTable, error) {
	t := s.tables[memKey{s.tx.Family, s.tx.Table}]
	if t == nil {
		return nil, unix.ENOENT
	}
	return t, nil
}

// refs counts what points at chain: jumps of rules and map verdicts.
func (t *memTable) refs(chain string) int {
	n := 0
	for _, c := range t.chains {
		for _, r := range c.rules {
			if r.Jump == chain {
				n++
			}
		}
	}
	for name, els := range t.maps {
		if isDNATMap(name) {
			continue // a comment, not a reference
		}
		for _, to := range els {
			if to == chain {
				n++
			}
		}
	}
	return n
}

func (v tableObj) simulate(s *memTx, vb verb) error {
	k := memKey{s.tx.Family, s.tx.Table}
	switch vb {
	case opAdd, opCreate:
		if s.tables[k] != nil {
			if vb == opCreate {
				return unix.EEXIST
			}
			return nil
		}
		s.tables[k] = newMemTable(v.comment)
		return nil
	case opDelete:
		if s.tables[k] == nil {
			return unix.ENOENT
		}
		delete(s.tables, k)
		return nil
	}
	return unix.EINVAL
}

func (v chainObj) simulate(s *memTx, vb verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	c := t.chains[v.name]
	switch vb {
	case opAdd, opCreate:
		if c != nil {
			if vb == opCreate {
				return unix.EEXIST
			}
			return nil
		}
		t.chains[v.name] = &memChain{comment: v.comment, base: v.base}
	case opFlush:
		if c == nil {
			return unix.ENOENT
		}
		c.rules, c.conditions = nil, nil
	case opDelete:
		if c == nil {
			return unix.ENOENT
		}
		if len(c.rules) > 0 || t.refs(v.name) > 0 {
			return unix.EBUSY
		}
		delete(t.chains, v.name)
	}
	return nil
}

func (v mapObj) simulate(s *memTx, vb verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	return simulateSet(t.maps, v.name, vb, t.looksUp(func(r RuleState) bool { return r.Lookup == v.name }))
}

// simulateSet applies vb to the set or map name of sets: made empty
// (EEXIST on create where it is), or deleted (ENOENT where it is not,
// EBUSY while a rule looks it up).
func simulateSet[E any](sets map[string]map[string]E, name string, vb verb, inUse bool) error {
	switch vb {
	case opAdd, opCreate:
		if sets[name] != nil {
			if vb == opCreate {
				return unix.EEXIST
			}
			return nil
		}
		sets[name] = map[string]E{}
	case opDelete:
		if sets[name] == nil {
			return unix.ENOENT
		}
		if inUse {
			return unix.EBUSY
		}
		delete(sets, name)
	}
	return nil
}

// looksUp reports whether a rule of the table is one of match.
func (t *memTable) looksUp(match func(RuleState) bool) bool {
	for _, c := range t.chains {
		if slices.ContainsFunc(c.rules, match) {
			return true
		}
	}
	return false
}

func (v elemObj) simulate(s *memTx, vb verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	els := t.maps[v.key.Map()]
	if els == nil {
		return unix.ENOENT
	}
	id := v.key.ID()
	held, exists := els[id]
	if v.key.Flat {
		switch vb {
		case opAdd, opCreate:
			// the kernel compares an existing element's data, not its
			// comment: the same target is taken as done
			if exists && (vb == opCreate || t.targets[id] != v.to) {
				return unix.EEXIST
			}
			if !exists {
				els[id], t.targets[id], t.srcs[id] = v.chain, v.to, v.srcs
			}
		case opDelete:
			if !exists {
				return unix.ENOENT
			}
			delete(els, id)
			delete(t.targets, id)
			delete(t.srcs, id)
		}
		return nil
	}
	switch vb {
	case opAdd, opCreate:
		if t.chains[v.chain] == nil {
			return unix.ENOENT
		}
		if exists && (vb == opCreate || held != v.chain) {
			return unix.EEXIST
		}
		if !exists && v.key.IsRange() {
			// The kernel refuses an interval whose ends fall inside
			// another (EEXIST); this one refuses any overlap, so that
			// a test catches a transaction that would leave the
			// kernel two intervals for a port.
			for other := range els {
				if k, ok := keyFromID(other); ok && overlaps(k, v.key) {
					return unix.EEXIST
				}
			}
		}
		els[id] = v.chain
	case opDelete:
		if !exists {
			return unix.ENOENT
		}
		delete(els, id)
	}
	return nil
}

func (v *Rule) simulate(s *memTx, _ verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	c := t.chains[v.Chain]
	if c == nil {
		return unix.ENOENT
	}
	if v.Handle != 0 {
		for i, r := range c.rules {
			if r.Handle == v.Handle {
				c.rules = append(c.rules[:i:i], c.rules[i+1:]...)
				c.conditions = append(c.conditions[:i:i], c.conditions[i+1:]...)
				return nil
			}
		}
		return unix.ENOENT
	}
	var a nfnl.Attrs
	first, raw := v.attrs(&Tx{Family: s.tx.Family, Table: s.tx.Table}, &a)
	r := decodeRule(s.tx.Family, a.Bytes())
	if r.DNATMap != "" {
		// the map's elements, read from the messages that write them
		for _, m := range first {
			if m.Type == nfnl.NftType(unix.NFT_MSG_NEWSETELEM) {
				r.DNATs = append(r.DNATs, decodeDNATs(s.tx.Family, m.Attrs)...)
			}
		}
	}
	if r.Jump != "" && t.chains[r.Jump] == nil {
		return unix.ENOENT
	}
	if r.Lookup != "" && t.maps[r.Lookup] == nil {
		return unix.ENOENT
	}
	if r.Member != "" && t.hairpins[r.Member] == nil {
		return unix.ENOENT
	}
	if r.DNATMap != "" && !strings.HasPrefix(r.DNATMap, "__") && t.maps[r.DNATMap] == nil {
		return unix.ENOENT
	}
	s.nextHandle++
	r.Handle = s.nextHandle
	c.rules = append(c.rules, r)
	c.conditions = append(c.conditions, raw)
	return nil
}

func (m *Memory) state(f plan.Family, table string) *memTable { return m.tables[memKey{f, table}] }

// Chain reads one chain; nil when it or its table is absent.
func (m *Memory) Chain(f plan.Family, table, chain string) (*ChainState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.chain(f, table, chain), nil
}

// chain is Chain under the lock.
func (m *Memory) chain(f plan.Family, table, chain string) *ChainState {
	t := m.state(f, table)
	if t == nil || t.chains[chain] == nil {
		return nil
	}
	c := t.chains[chain]
	cs := &ChainState{Comment: c.comment, Rules: append([]RuleState(nil), c.rules...)}
	if table != Table {
		return cs
	}
	cs.splitRecord()
	cs.Owned = t.maps[OwnersMap][chain] == chain
	return cs
}

// Elements answers as the kernel's reads do (Kernel.Elements).
func (m *Memory) Elements(f plan.Family, keys []Key) ([]Element, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.state(f, Table)
	if t == nil {
		return nil, nil
	}
	var all []Element
	for _, name := range sortedStrings(t.maps) {
		for _, id := range sortedStrings(t.maps[name]) {
			if k, ok := keyFromID(id); ok {
				all = append(all, Element{Key: k, Chain: t.maps[name][id], To: t.targets[id], Srcs: t.srcs[id]})
			}
		}
	}
	return elementsFor(keys, all), nil
}

// Table reads a table whole; nil when it is absent.
func (m *Memory) Table(f plan.Family, table string) (*State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.state(f, table)
	if t == nil {
		return nil, nil
	}
	st := newState()
	for n := range t.chains {
		st.Chains[n] = m.chain(f, table, n)
	}
	for n, els := range t.maps {
		st.Maps[n] = true
		if n == OwnersMap {
			continue // Owned, above
		}
		for id, c := range els {
			st.Holders[id] = c
			if v, ok := t.targets[id]; ok {
				st.Targets[id], st.Srcs[id] = v, t.srcs[id]
			}
		}
	}
	for _, n := range sortedStrings(t.hairpins) {
		st.Maps[n] = true
		for _, id := range sortedStrings(t.hairpins[n]) {
			st.Hairpins = append(st.Hairpins, t.hairpins[n][id])
		}
	}
	return st, nil
}

// Hairpins answers as the kernel's gets do (Kernel.Hairpins).
func (m *Memory) Hairpins(f plan.Family, points []Hairpin) ([]Hairpin, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.state(f, Table)
	if t == nil {
		return nil, nil
	}
	var out []Hairpin
	for _, pt := range points {
		pt.Src = parsePrefix(pt.Src).String()
		if h, ok := t.hairpins[pt.set()][pt.ID()]; ok {
			out = append(out, h)
		}
	}
	return out, nil
}

// Probe answers as the kernel's gets do (Kernel.Probe).
func (m *Memory) Probe(f plan.Family, chains, sets []string, keys []Key) ([]string, []Element, error) {
	m.mu.Lock()
	t := m.state(f, Table)
	var missing []string
	for _, c := range chains {
		if t == nil || t.chains[c] == nil {
			missing = append(missing, c)
		}
	}
	for _, c := range sets {
		if t == nil || (t.maps[c] == nil && t.hairpins[c] == nil) {
			missing = append(missing, c)
		}
	}
	m.mu.Unlock()
	held, err := m.Elements(f, keys)
	return missing, held, err
}

// Dump prints every table, sorted, one object a line: a whole-state
// picture tests compare before and after a sequence.
func (m *Memory) Dump() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var keys []memKey
	for k := range m.tables {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].f != keys[j].f {
			return keys[i].f < keys[j].f
		}
		return keys[i].name < keys[j].name
	})
	var b strings.Builder
	for _, k := range keys {
		t := m.tables[k]
		fmt.Fprintf(&b, "table %s %s\n", nftFamily(k.f), k.name)
		for _, n := range sortedStrings(t.chains) {
			c := t.chains[n]
			fmt.Fprintf(&b, "  chain %s %q\n", n, c.comment)
			for _, r := range c.rules {
				r.Handle = 0
				fmt.Fprintf(&b, "    %+v\n", r)
			}
		}
		for _, n := range sortedStrings(t.maps) {
			fmt.Fprintf(&b, "  map %s\n", n)
			for _, id := range sortedStrings(t.maps[n]) {
				if to, ok := t.targets[id]; ok {
					fmt.Fprintf(&b, "    %s comment %s : %s\n", strings.TrimPrefix(id, n+" "), t.maps[n][id], to)
					continue
				}
				fmt.Fprintf(&b, "    %s : goto %s\n", strings.TrimPrefix(id, n+" "), t.maps[n][id])
			}
		}
		for _, n := range sortedStrings(t.hairpins) {
			fmt.Fprintf(&b, "  set %s\n", n)
			for _, id := range sortedStrings(t.hairpins[n]) {
				fmt.Fprintf(&b, "    %s comment %s\n", strings.TrimPrefix(id, n+" "), t.hairpins[n][id].Chain)
			}
		}
	}
	return b.String()
}

func (v dnatMapObj) simulate(s *memTx, vb verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	return simulateSet(t.maps, v.name, vb, t.looksUp(func(r RuleState) bool { return r.DNATMap == v.name }))
}

func (v hairpinSetObj) simulate(s *memTx, vb verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	name := hairpinSet(v.addr, v.ones)
	return simulateSet(t.hairpins, name, vb, t.looksUp(func(r RuleState) bool { return r.Member == name }))
}

func (ownersMapObj) simulate(s *memTx, vb verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	return simulateSet(t.maps, OwnersMap, vb, false)
}

// simulate keeps chain's element of the owners map as chain -> chain.
func (v ownerObj) simulate(s *memTx, vb verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	els := t.maps[OwnersMap]
	if els == nil || ownerKey(v.chain) == nil {
		return unix.ENOENT
	}
	to, exists := els[v.chain]
	switch vb {
	case opAdd, opCreate:
		if t.chains[v.chain] == nil {
			return unix.ENOENT // the goto's chain
		}
		if exists && (vb == opCreate || to != v.chain) {
			return unix.EEXIST
		}
		els[v.chain] = v.chain
	case opDelete:
		if !exists {
			return unix.ENOENT
		}
		delete(els, v.chain)
	}
	return nil
}

func (v hairpinObj) simulate(s *memTx, vb verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	set := t.hairpins[v.h.set()]
	if set == nil {
		return unix.ENOENT
	}
	h := v.h
	h.Src = parsePrefix(h.Src).String()
	id := h.ID()
	_, exists := set[id]
	switch vb {
	case opAdd, opCreate:
		if exists && vb == opCreate {
			return unix.EEXIST
		}
		if !exists {
			set[id] = h
		}
	case opDelete:
		if !exists {
			return unix.ENOENT
		}
		delete(set, id)
	}
	return nil
}
