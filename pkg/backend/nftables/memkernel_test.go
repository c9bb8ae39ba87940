package nftables

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/portmap-dev/portmap/pkg/nft"

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
	base    *nft.BaseChain
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
func (m *Memory) Apply(tx *nft.Tx) error {
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
func (m *Memory) Validate(tx *nft.Tx) error {
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
	simulate(s *memTx, v nft.Verb) error
}

// memTx is a transaction being applied to a copy of the tables.
type memTx struct {
	*Memory
	tx *nft.Tx
}

func (m *Memory) simulate(tx *nft.Tx) (*Memory, error) {
	c := &Memory{tables: map[memKey]*memTable{}, nextHandle: m.nextHandle}
	for k, t := range m.tables {
		c.tables[k] = t.clone()
	}
	s := &memTx{c, tx}
	for i, o := range tx.Ops() {
		if err := simulate(s, o); err != nil {
			return nil, &nft.Error{Op: tx.OpText(i), Err: err}
		}
	}
	return c, nil
}

// simulate applies one operation: pkg/nft's objects here, the layout's
// element kinds by their simulate methods.
func simulate(s *memTx, o nft.Op) error {
	switch v := o.Obj.(type) {
	case *nft.Table:
		return simulateTable(s, v, o.Verb)
	case *nft.Chain:
		return simulateChain(s, v, o.Verb)
	case *nft.Set:
		return simulateSetDecl(s, v, o.Verb)
	case *nft.Rule:
		return simulateRule(s, v)
	case simulator:
		return v.simulate(s, o.Verb)
	}
	return fmt.Errorf("%T: not an object the in-memory kernel knows", o.Obj)
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
	t := s.tables[memKey{plan.Family(s.tx.Family), s.tx.TableName}]
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

func simulateTable(s *memTx, v *nft.Table, vb nft.Verb) error {
	k := memKey{plan.Family(s.tx.Family), s.tx.TableName}
	switch vb {
	case nft.Add, nft.Create:
		if s.tables[k] != nil {
			if vb == nft.Create {
				return unix.EEXIST
			}
			return nil
		}
		s.tables[k] = newMemTable(v.Comment)
		return nil
	case nft.Delete:
		if s.tables[k] == nil {
			return unix.ENOENT
		}
		delete(s.tables, k)
		return nil
	}
	return unix.EINVAL
}

func simulateChain(s *memTx, v *nft.Chain, vb nft.Verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	c := t.chains[v.Name]
	switch vb {
	case nft.Add, nft.Create:
		if c != nil {
			if vb == nft.Create {
				return unix.EEXIST
			}
			return nil
		}
		t.chains[v.Name] = &memChain{comment: v.Comment, base: v.Base}
	case nft.Flush:
		if c == nil {
			return unix.ENOENT
		}
		c.rules, c.conditions = nil, nil
	case nft.Delete:
		if c == nil {
			return unix.ENOENT
		}
		if len(c.rules) > 0 || t.refs(v.Name) > 0 {
			return unix.EBUSY
		}
		delete(t.chains, v.Name)
	}
	return nil
}

// simulateSetDecl keeps each set by what its elements are: the hairpin
// sets', the verdict and DNAT maps' and the owners map's.
func simulateSetDecl(s *memTx, v *nft.Set, vb nft.Verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	switch _, _, hairpin := hairpinLength(v.Name); {
	case hairpin:
		return simulateSet(t.hairpins, v.Name, vb, t.looksUp(func(r RuleState) bool { return r.Member == v.Name }))
	case v.Name == ownersMap:
		return simulateSet(t.maps, v.Name, vb, false)
	case isDNATMap(v.Name):
		return simulateSet(t.maps, v.Name, vb, t.looksUp(func(r RuleState) bool { return r.DNATMap == v.Name }))
	}
	return simulateSet(t.maps, v.Name, vb, t.looksUp(func(r RuleState) bool { return r.Lookup == v.Name }))
}

// simulateSet applies vb to the set or map name of sets: made empty
// (EEXIST on create where it is), or deleted (ENOENT where it is not,
// EBUSY while a rule looks it up).
func simulateSet[E any](sets map[string]map[string]E, name string, vb nft.Verb, inUse bool) error {
	switch vb {
	case nft.Add, nft.Create:
		if sets[name] != nil {
			if vb == nft.Create {
				return unix.EEXIST
			}
			return nil
		}
		sets[name] = map[string]E{}
	case nft.Delete:
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

func (v elemObj) simulate(s *memTx, vb nft.Verb) error {
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
		case nft.Add, nft.Create:
			// the kernel compares an existing element's data, not its
			// comment: the same target is taken as done
			if exists && (vb == nft.Create || t.targets[id] != v.to) {
				return unix.EEXIST
			}
			if !exists {
				els[id], t.targets[id], t.srcs[id] = v.chain, v.to, v.srcs
			}
		case nft.Delete:
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
	case nft.Add, nft.Create:
		if t.chains[v.chain] == nil {
			return unix.ENOENT
		}
		if exists && (vb == nft.Create || held != v.chain) {
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
	case nft.Delete:
		if !exists {
			return unix.ENOENT
		}
		delete(els, id)
	}
	return nil
}

func simulateRule(s *memTx, v *nft.Rule) error {
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
	first, raw := v.Attrs(nft.NewTx(s.tx.Family, s.tx.TableName), &a)
	r := decodeRule(plan.Family(s.tx.Family), a.Bytes())
	if r.DNATMap != "" {
		// the map's elements, read from the messages that write them
		for _, m := range first {
			if m.Type == nfnl.NftType(unix.NFT_MSG_NEWSETELEM) {
				r.DNATs = append(r.DNATs, decodeDNATs(plan.Family(s.tx.Family), m.Attrs)...)
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
	cs.Owned = t.maps[ownersMap][chain] == chain
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
		if n == ownersMap {
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
		pt.Src = nft.ParsePrefix(pt.Src).String()
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

// simulate keeps chain's element of the owners map as chain -> chain.
func (v ownerObj) simulate(s *memTx, vb nft.Verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	els := t.maps[ownersMap]
	if els == nil || ownerKey(v.chain) == nil {
		return unix.ENOENT
	}
	to, exists := els[v.chain]
	switch vb {
	case nft.Add, nft.Create:
		if t.chains[v.chain] == nil {
			return unix.ENOENT // the goto's chain
		}
		if exists && (vb == nft.Create || to != v.chain) {
			return unix.EEXIST
		}
		els[v.chain] = v.chain
	case nft.Delete:
		if !exists {
			return unix.ENOENT
		}
		delete(els, v.chain)
	}
	return nil
}

func (v hairpinObj) simulate(s *memTx, vb nft.Verb) error {
	t, err := s.table()
	if err != nil {
		return err
	}
	set := t.hairpins[v.h.set()]
	if set == nil {
		return unix.ENOENT
	}
	h := v.h
	h.Src = nft.ParsePrefix(h.Src).String()
	id := h.ID()
	_, exists := set[id]
	switch vb {
	case nft.Add, nft.Create:
		if exists && vb == nft.Create {
			return unix.EEXIST
		}
		if !exists {
			set[id] = h
		}
	case nft.Delete:
		if !exists {
			return unix.ENOENT
		}
		delete(set, id)
	}
	return nil
}
