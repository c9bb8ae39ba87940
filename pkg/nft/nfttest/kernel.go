package nfttest

import (
	"slices"
	"strings"
	"sync"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// Kernel is nf_tables in memory, for tests without root, as knftables'
// Fake is for knftables: it takes the netlink messages pkg/nft writes —
// a batch all or nothing, with the errnos the kernel answers (EEXIST for
// an object that exists or an element whose data differs or whose
// interval overlaps another, ENOENT for a missing table, chain, set,
// element, jump or goto target, EBUSY for a chain or set still in use)
// — and answers gets and dumps with the attributes it was given, so a
// user's own netlink reads and decoders run over it unchanged. It keeps
// tables, chains, sets, elements and rules, not what they mean: a rule
// is its attributes, and only its verdicts and lookups are read, for the
// references a deletion checks.
type Kernel struct {
	mu     sync.Mutex
	tables map[tableKey]*table
	handle uint64 // the last rule handle given
	// Commits counts the batches committed; Refused those refused (on
	// the real kernel, each costs an RCU grace period, ~15 ms).
	Commits, Refused int
	// Listed counts the set elements dumps answered: what of a read
	// grows with the node.
	Listed int
	// NotWritable is Writable's answer: nil, an error, or
	// nfnl.ErrNoProbe for a kernel before Linux 6.3.
	NotWritable error
}

type tableKey struct {
	family uint8
	name   string
}

type table struct {
	attrs  []byte
	chains []*chain // in creation order, as dumps list them
	sets   []*set
}

type chain struct {
	name  string
	attrs []byte
	rules []*rule
}

type rule struct {
	handle uint64
	attrs  []byte   // as sent, anonymous sets named
	jumps  []string // chains its verdicts name
	sets   []string // sets it looks up
}

type set struct {
	name     string
	attrs    []byte
	flags    uint32
	id       uint32 // in the batch that made it
	elements []*element
}

type element struct {
	key, end []byte // end: an interval's last key
	data     []byte // NFTA_SET_ELEM_DATA's value: a value or a verdict
	chain    string // a verdict's jump or goto target
	attrs    []byte // NFTA_LIST_ELEM's value as sent
}

var (
	_ nft.Conn     = (*Kernel)(nil)
	_ nft.Scripter = (*Kernel)(nil)
)

// New returns an empty nf_tables.
func New() *Kernel { return &Kernel{tables: map[tableKey]*table{}} }

// Flush empties it, as `nft flush ruleset` would the real one.
func (k *Kernel) Flush() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.tables = map[tableKey]*table{}
}

// Writable is NotWritable.
func (k *Kernel) Writable(uint8) error { return k.NotWritable }

// Batch applies msgs all or nothing; without commit it checks them and
// keeps nothing. A failure is an *nfnl.Error naming the message.
func (k *Kernel) Batch(msgs []nfnl.Msg, commit bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	tx := &batch{tables: cloneTables(k.tables), handle: k.handle, ids: map[uint32]string{}}
	for i, m := range msgs {
		if errno := tx.apply(m); errno != 0 {
			if commit {
				k.Refused++
			}
			return &nfnl.Error{Index: i, Errno: errno}
		}
	}
	if commit {
		k.tables, k.handle = tx.tables, tx.handle
		k.Commits++
	}
	return nil
}

// batch is a batch being applied to a copy of the tables.
type batch struct {
	tables map[tableKey]*table
	handle uint64
	ids    map[uint32]string // set IDs of this batch -> their names
}

func cloneTables(in map[tableKey]*table) map[tableKey]*table {
	out := make(map[tableKey]*table, len(in))
	for key, t := range in {
		c := &table{attrs: t.attrs}
		for _, ch := range t.chains {
			cc := *ch
			cc.rules = slices.Clone(ch.rules)
			c.chains = append(c.chains, &cc)
		}
		for _, s := range t.sets {
			sc := *s
			sc.elements = slices.Clone(s.elements)
			c.sets = append(c.sets, &sc)
		}
		out[key] = c
	}
	return out
}

func str(b []byte, typ uint16) string {
	v, _ := nfnl.Find(b, typ)
	s, _, _ := strings.Cut(string(v), "\x00")
	return s
}

func (t *table) chain(name string) (int, *chain) {
	for i, c := range t.chains {
		if c.name == name {
			return i, c
		}
	}
	return -1, nil
}

func (t *table) set(name string) (int, *set) {
	for i, s := range t.sets {
		if s.name == name {
			return i, s
		}
	}
	return -1, nil
}

// refs counts the rules and verdict elements that name chain.
func (t *table) refs(name string) int {
	n := 0
	for _, c := range t.chains {
		for _, r := range c.rules {
			n += count(r.jumps, name)
		}
	}
	for _, s := range t.sets {
		for _, e := range s.elements {
			if e.chain == name {
				n++
			}
		}
	}
	return n
}

func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// lookedUp reports whether a rule looks set name up.
func (t *table) lookedUp(name string) bool {
	for _, c := range t.chains {
		for _, r := range c.rules {
			if slices.Contains(r.sets, name) {
				return true
			}
		}
	}
	return false
}

// Apply applies tx in one batch, committed or only checked, with the
// conditions of its rules (nft syntax, which only nft compiles) left
// out, as if they matched; a failure names the operation.
func (k *Kernel) Apply(tx *nft.Tx, commit bool) error {
	msgs, err := withoutConditions(tx).Messages()
	if err != nil {
		return err
	}
	if err := k.Batch(msgs, commit); err != nil {
		return &nft.Error{Op: tx.Describe(err), Err: err}
	}
	return nil
}

// withoutConditions is tx with its rules' conditions left out.
func withoutConditions(tx *nft.Tx) *nft.Tx {
	out := nft.NewTx(tx.Family, tx.TableName)
	verbs := map[nft.Verb]func(nft.Object){nft.Add: out.Add, nft.Create: out.Create, nft.Flush: out.Flush, nft.Delete: out.Delete}
	for _, o := range tx.Ops() {
		if r, ok := o.Obj.(*nft.Rule); ok && r.NeedsNft() {
			c := *r
			c.Stmts = nil
			for _, s := range r.Stmts {
				if _, ok := s.(nft.Conditions); !ok {
					c.Stmts = append(c.Stmts, s)
				}
			}
			o.Obj = &c
		}
		verbs[o.Verb](o.Obj)
	}
	return out
}
