package nftables

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Backend applies plans of one family.
type Backend struct {
	Family plan.Family
	Kernel Kernel
	Lock   func() (release func(), err error)
	// Log receives notes such as port takeovers.
	Log io.Writer
}

// New returns the backend of family f on the real kernel: nf_tables over
// netlink, in this process. It needs no nft binary (only conditions,
// which are nft syntax, are compiled by nft).
func New(f plan.Family, log io.Writer) (*Backend, error) {
	return &Backend{
		Family: f,
		Kernel: &netlinkKernel{},
		Lock:   lock.Host,
		Log:    log,
	}, nil
}

// NewOn returns the backend of family f speaking nf_tables through c
// (an in-memory nf_tables in tests), without the host lock. Where c is
// an nft.Scripter (nfttest.Kernel: conditions left out), a transaction
// holding conditions goes to it, not to nft.
func NewOn(f plan.Family, log io.Writer, c nft.Conn) *Backend {
	return &Backend{Family: f, Kernel: &netlinkKernel{conn: c}, Lock: func() (func(), error) { return func() {}, nil }, Log: log}
}

// Apply installs the plan's layout, replacing whatever the attachment
// had; a key another attachment holds is taken over (the newest ADD
// wins).
func (b *Backend) Apply(p *plan.Plan) error {
	if p.ContainerNet == nil {
		return errors.New("no container address to forward to")
	}
	l := layoutOf(p)
	// Fast path (single ports only: an interval must read what shares its
	// ports under the lock, ranges.go).
	if !l.hasRanges() {
		if done, err := b.fastAdd(l); done || err != nil {
			return err
		}
	}

	// Slow path, under the lock: a pass's repair of this one attachment.
	// The skeleton is written only where skeletonGaps (CHECK's and the
	// pass's judge) finds a gap.
	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	chains, err := b.Kernel.Read(b.Family, Query{Chains: append([]string{l.chain.Name}, skeletonChains(l.needs)...), Sets: skeletonSets(l.lengths)})
	if err != nil {
		return err
	}
	c := chains.Chains[l.chain.Name]
	var prev []Key
	if c != nil {
		prev = c.keys()
	}
	keys := uniqueKeys(append(l.keys[:len(l.keys):len(l.keys)], prev...))
	st, err := b.Kernel.Read(b.Family, Query{Keys: withOtherMaps(keys)})
	if err != nil {
		return err
	}
	els := elementsOfState(st)
	hps, err := b.hairpinsOf(sharingPorts(els, keys), l.hairpins...)
	if err != nil {
		return err
	}
	skel, tx := newTx(b.Family), newTx(b.Family)
	if gaps, _ := skeletonGaps(b.Family, l.needs, l.lengths, chains.Chains); len(gaps) > 0 || len(chains.Missing) > 0 {
		// the dispatch chain for the hairpin lengths the node has: the
		// skeleton's rewrite keeps them
		addSkeleton(skel, l.needs, lengthsOf(chains.Chains[DispatchChain], l))
	}
	l.rewriteChain(tx, c)
	place(tx, l, els, hps, b.Log)
	if err := b.applyWith(skel, tx); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	return nil
}

// applyWith commits skel, what of the skeleton a write needs, and tx as
// one transaction. Where tx holds conditions, which nft compiles, skel
// is committed first on its own over netlink: nft before 1.0 (Debian
// 11's 0.9.8) cannot read the skeleton's DNAT maps, whose data is a
// concatenation (docs/compat.md), and refused the whole transaction; a
// skeleton left when tx then fails is what the next ADD writes anyway.
func (b *Backend) applyWith(skel, tx *nft.Tx) error {
	if tx.NeedsNft() && skel.Len() > 0 {
		if err := b.Kernel.Apply(skel); err != nil {
			return err
		}
		return b.Kernel.Apply(tx)
	}
	skel.Append(tx)
	return b.Kernel.Apply(skel)
}

// fastAdd is ADD's fast path: one round trip of gets, then one batch.
// It reads first whether its chain exists (ADD again), whether another
// attachment holds a key (a takeover) and, for a flat attachment, the
// shared chains and sets it relies on, because a batch the kernel refuses
// costs an RCU grace period (~15 ms). A fresh node still fails the batch
// (a chain's jump to a missing mark chain) and goes to the slow path.
// done says it applied.
func (b *Backend) fastAdd(l *layout) (done bool, err error) {
	chains, sets, keys := l.probes()
	st, err := b.Kernel.Read(b.Family, Query{Probe: append(chains, l.chain.Name), Sets: sets, Keys: keys})
	if err != nil {
		return false, err
	}
	if !slices.Equal(st.Missing, []string{l.chain.Name}) || len(st.Elements) > 0 {
		return false, nil
	}
	if err := b.Kernel.Apply(l.create()); err == nil {
		return true, nil
	} else if !missed(err) {
		return false, fmt.Errorf("apply: %w", err)
	}
	return false, nil
}

// Remove deletes the attachment's chain and the elements that still
// point at it (a flat attachment's also its hairpin elements and owners
// element), idempotently, never another attachment's. Its chain's
// comments name its keys, so DEL needs neither prevResult nor mappings.
// It reads the chain first and writes only when there is something to
// remove: a refused batch costs an RCU grace period (~15 ms).
func (b *Backend) Remove(p *plan.Plan) error {
	chain := ChainName(p.Owner)
	c, err := b.chain(chain)
	if err != nil {
		return err
	}
	if c == nil {
		return b.removeUpstreamLocked(p.Owner)
	}
	keys := uniqueKeys(append(layoutOf(p).keys, c.keys()...))
	if slices.ContainsFunc(keys, Key.IsRange) {
		if err := b.Kernel.Apply(fastDelTx(p.Family, chain, keys)); err == nil {
			return b.removeUpstreamLocked(p.Owner)
		} else if !missed(err) {
			return fmt.Errorf("remove chain %s: %w", chain, err)
		}
	}

	// Under the lock, release only the elements that still point here.
	// Single ports always come here: adding each element with its own
	// verdict, as fastDelTx does, makes the kernel validate every chain
	// a verdict map leads to at commit (~2 ms beside 1000 attachments).
	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	if err := b.removeUpstream(p.Owner); err != nil {
		return err
	}
	c, err = b.chain(chain)
	if err != nil || c == nil {
		return err
	}
	mine := uniqueKeys(append(keys, c.keys()...))
	st, err := b.Kernel.Read(b.Family, Query{Keys: uniqueKeys(withOtherMaps(mine))})
	if err != nil {
		return err
	}
	var own []Element
	for _, e := range elementsOfState(st) {
		if e.Chain == chain {
			own = append(own, e)
		}
	}
	hps, err := b.strayHairpins(p, mine, own)
	if err != nil {
		return err
	}
	st.Chains, st.Hairpins = map[string]*ChainState{chain: c}, hps
	tx := newTx(b.Family)
	removeChains(tx, st, map[string]bool{chain: true})
	if err := b.Kernel.Apply(tx); err != nil {
		return fmt.Errorf("remove chain %s: %w", chain, err)
	}
	return nil
}

// strayHairpins reads the hairpin elements DEL removes: those own's
// elements claim, and those of the attachment's other flat keys (of p
// and its claims), whose DNAT element is gone (deleted by hand, or by a
// flush of the map): looked up with the sources own or p name, and where
// neither names one (every element gone, a DEL without prevResult), read
// from the whole table. The caller keeps what its chain owns.
func (b *Backend) strayHairpins(p *plan.Plan, keys []Key, own []Element) ([]Hairpin, error) {
	held := map[Key]bool{}
	var srcs []string
	for _, e := range own {
		held[e.Key] = true
		srcs = append(srcs, e.Srcs...)
	}
	if p.ContainerNet != nil {
		srcs = append(srcs, hairpinSrcs(p)...)
	}
	var gone []Key
	for _, k := range keys {
		if k.Flat && !held[k] {
			gone = append(gone, k)
		}
	}
	if len(gone) > 0 && len(srcs) == 0 {
		st, err := b.Kernel.Table(b.Family, Table)
		if err != nil || st == nil {
			return nil, err
		}
		return st.Hairpins, nil
	}
	var more []Hairpin
	for _, k := range gone {
		for _, src := range slices.Compact(slices.Sorted(slices.Values(srcs))) {
			more = append(more, Hairpin{Src: src, Key: k})
		}
	}
	return b.hairpinsOf(own, more...)
}

// chain reads the chain of our table named name with its rules; nil
// when it is absent.
func (b *Backend) chain(name string) (*ChainState, error) {
	st, err := b.Kernel.Read(b.Family, Query{Chains: []string{name}})
	if err != nil {
		return nil, err
	}
	return st.Chains[name], nil
}

func uniqueKeys(keys []Key) []Key {
	seen := map[Key]bool{}
	out := keys[:0:0]
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// fastDelTx is DEL's fast path: release each of the attachment's keys
// while it still points at its chain, then delete the chain (which the
// kernel refuses while any element still points at it: an interval of
// its that another ADD cut down, an element an older release wrote for
// each port of a range).
func fastDelTx(f plan.Family, chain string, keys []Key) *nft.Tx {
	tx := newTx(f)
	for _, k := range keys {
		tx.Add(Element{Key: k, Chain: chain})
		tx.Delete(Element{Key: k})
	}
	tx.Flush(&nft.Chain{Name: chain})
	tx.Delete(&nft.Chain{Name: chain})
	return tx
}

// hairpinsOf reads the hairpin elements els' flat elements claim, and
// more.
func (b *Backend) hairpinsOf(els []Element, more ...Hairpin) ([]Hairpin, error) {
	points := more
	for _, e := range els {
		if e.Key.Flat {
			points = append(points, hairpinsClaimed(e)...)
		}
	}
	if len(points) == 0 {
		return nil, nil
	}
	st, err := b.Kernel.Read(b.Family, Query{Hairpins: points})
	if err != nil {
		return nil, err
	}
	seen := map[hairpinID]bool{}
	out := st.Hairpins[:0]
	for _, h := range st.Hairpins {
		if !seen[h.id()] {
			seen[h.id()] = true
			out = append(out, h)
		}
	}
	return out, nil
}

// sharingPorts are the flat elements of els that share a port with
// keys: those whose holder an ADD of keys may change (an interval's read
// brings every element of its class), so whose hairpin elements it
// reads.
func sharingPorts(els []Element, keys []Key) []Element {
	var out []Element
	for _, e := range els {
		if e.Key.Flat && overlapsAny(e.Key, keys) {
			out = append(out, e)
		}
	}
	return out
}

// hairpinsClaimed are the hairpin elements e's comment claims for its
// key (its owner's sources).
func hairpinsClaimed(e Element) []Hairpin {
	out := make([]Hairpin, 0, len(e.Srcs))
	for _, src := range e.Srcs {
		out = append(out, Hairpin{Src: src, Key: e.Key})
	}
	return out
}

// missed reports whether a fast path's batch failed the way it may when
// the node is not in the state it assumes, so the slow path runs: an
// object it creates exists or a key is held by another attachment
// (EEXIST: a re-ADD, a takeover), an object it uses is missing (ENOENT: a
// fresh node, a missing skeleton), or a chain it deletes is still
// referenced (EBUSY). Anything else — no permission, a batch too large —
// goes back to the caller. A kernel test holds the errnos to this. The
// iptables backend's word for the same is Missed.
func missed(err error) bool {
	return errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EBUSY) ||
		errors.Is(err, nft.ErrRefused)
}
