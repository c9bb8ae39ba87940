package nft

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// Tx is one transaction of one family's table, all or nothing. Text
// spells it as an nft script (golden files, and nft for a transaction
// holding conditions); Messages as the netlink batch the kernel gets.
// Both come from the same operations.
type Tx struct {
	Family    Family
	TableName string
	ops       []Op
	nextID    uint32
	// msgOp is, for each message Messages last returned, the index of the
	// operation it belongs to (errors name the operation).
	msgOp []int
}

// Verb is what an operation does to its object.
type Verb int

const (
	Add    Verb = iota // create, or leave as is when it exists
	Create             // create, failing when it exists
	Flush              // empty a chain
	Delete             // remove; failing when absent
)

// String is the verb as nft spells it.
func (v Verb) String() string { return [...]string{"add", "create", "flush", "delete"}[v] }

// Op is one operation of a transaction.
type Op struct {
	Verb Verb
	Obj  Object
}

// Object is one kind of nf_tables object a transaction writes. Each kind
// spells itself both ways, so a new kind is one type with two methods,
// not a case in two switches.
type Object interface {
	// Text writes verb v of the object in tx as nft reads it, the way
	// knftables writes it, ending with a newline.
	Text(tx *Tx, v Verb, b *strings.Builder)
	// Encode sets m's type and attributes for verb v in tx; messages the
	// object needs first (a rule's anonymous sets) are returned.
	Encode(tx *Tx, v Verb, m *nfnl.Msg, a *nfnl.Attrs) (first []nfnl.Msg, err error)
}

// NewTx starts a transaction of table.
func NewTx(f Family, table string) *Tx { return &Tx{Family: f, TableName: table} }

// Add adds obj: creates it, or leaves it as it is.
func (tx *Tx) Add(obj Object) { tx.ops = append(tx.ops, Op{Add, obj}) }

// Create creates obj, failing (EEXIST) where it exists.
func (tx *Tx) Create(obj Object) { tx.ops = append(tx.ops, Op{Create, obj}) }

// Flush empties obj, a chain.
func (tx *Tx) Flush(obj Object) { tx.ops = append(tx.ops, Op{Flush, obj}) }

// Delete removes obj, failing (ENOENT) where it is absent.
func (tx *Tx) Delete(obj Object) { tx.ops = append(tx.ops, Op{Delete, obj}) }

// Append adds the operations of more after tx's.
func (tx *Tx) Append(more *Tx) { tx.ops = append(tx.ops, more.ops...) }

// Grow makes room for n more operations.
func (tx *Tx) Grow(n int) { tx.ops = slices.Grow(tx.ops, n) }

// Ops are the operations, in order.
func (tx *Tx) Ops() []Op { return tx.ops }

// Len is the number of operations.
func (tx *Tx) Len() int { return len(tx.ops) }

// Head writes the start of a command of tx: "add chain ip cni_portmap".
func (tx *Tx) Head(b *strings.Builder, v Verb, kind string) {
	fmt.Fprintf(b, "%s %s %s %s", v, kind, tx.Family, tx.TableName)
}

// Text is the transaction as an nft script, as knftables writes it.
func (tx *Tx) Text() string {
	var b strings.Builder
	for _, o := range tx.ops {
		o.Obj.Text(tx, o.Verb, &b)
	}
	return b.String()
}

// String is for errors: the transaction's first lines.
func (tx *Tx) String() string {
	t := tx.Text()
	if i := strings.Index(t, "\n"); i > 0 && strings.Count(t, "\n") > 1 {
		return t[:i] + " ..."
	}
	return strings.TrimSpace(t)
}

// NextID is a new set ID of the transaction, by which a rule of the same
// batch names a set not yet committed.
func (tx *Tx) NextID() uint32 { tx.nextID++; return tx.nextID }

// Messages is the transaction as one netlink batch. It fails when a rule
// holds conditions (NeedsNft).
func (tx *Tx) Messages() ([]nfnl.Msg, error) {
	fam := tx.Family.Proto()
	tx.nextID, tx.msgOp = 0, nil
	out := make([]nfnl.Msg, 0, len(tx.ops))
	tx.msgOp = make([]int, 0, len(tx.ops))
	// The messages' attributes are written one after the other into
	// chunks of 64 KiB, not each into a buffer of its own: 5000 mappings
	// are 10,000 messages.
	var arena []byte
	for i, o := range tx.ops {
		if cap(arena)-len(arena) < 1024 {
			arena = make([]byte, 0, 64<<10)
		}
		free := arena[len(arena):]
		a := nfnl.AttrsIn(free)
		m := nfnl.Msg{Family: fam}
		first, err := o.Obj.Encode(tx, o.Verb, &m, &a)
		if err != nil {
			return nil, err
		}
		for _, fm := range first {
			out = append(out, fm)
			tx.msgOp = append(tx.msgOp, i)
		}
		switch o.Verb {
		case Add:
			m.Flags |= unix.NLM_F_CREATE
		case Create:
			m.Flags |= unix.NLM_F_CREATE | unix.NLM_F_EXCL
		}
		b := a.Bytes()
		if len(b) > 0 && len(b) <= cap(free) && &b[0] == &free[:1][0] { // written in place
			arena = arena[:len(arena)+len(b)]
		}
		m.Attrs = b[:len(b):len(b)] // an append to one cannot write into the next
		out = append(out, m)
		tx.msgOp = append(tx.msgOp, i)
	}
	return out, nil
}

// Describe names the operation a batch error is about: the one the
// failed message of the last Messages belongs to, as nft would spell it.
func (tx *Tx) Describe(err error) string {
	var ne *nfnl.Error
	if errors.As(err, &ne) {
		if ne.Index >= 0 && ne.Index < len(tx.msgOp) {
			return tx.OpText(tx.msgOp[ne.Index])
		}
	}
	return fmt.Sprintf("%s transaction of %d operations", tx.Family, len(tx.ops))
}

// OpText is operation i as nft spells it, without its newline.
func (tx *Tx) OpText(i int) string {
	one := &Tx{Family: tx.Family, TableName: tx.TableName, ops: tx.ops[i : i+1]}
	return strings.TrimSpace(one.Text())
}
