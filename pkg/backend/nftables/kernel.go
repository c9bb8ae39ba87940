package nftables

import (
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// netlinkKernel is the real kernel: nf_tables over netlink, in-process,
// one socket for the life of the backend (or what NewOn gives). Only a
// transaction holding conditions (nft syntax) runs nft.
type netlinkKernel struct {
	mu   sync.Mutex
	conn nft.Conn
}

func (k *netlinkKernel) c() (nft.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.conn == nil {
		c, err := nfnl.Open()
		if err != nil {
			return nil, err
		}
		k.conn = c
	}
	return k.conn, nil
}

// Apply commits tx as one batch (or, for conditions, one nft -f).
func (k *netlinkKernel) Apply(tx *nft.Tx) error { return k.batch(tx, true) }

// Validate sends tx without ending the batch: the kernel checks each
// message, then aborts.
func (k *netlinkKernel) Validate(tx *nft.Tx) error { return k.batch(tx, false) }

// Writable commits a batch that changes nothing (nfnl.Conn.Writable).
func (k *netlinkKernel) Writable(f plan.Family) error {
	c, err := k.c()
	if err != nil {
		return err
	}
	return c.Writable(nft.Family(f).Proto())
}

func (k *netlinkKernel) batch(tx *nft.Tx, commit bool) error {
	c, err := k.c()
	if err != nil {
		return err
	}
	if _, ok := c.(nft.Scripter); !ok && tx.NeedsNft() {
		if err := nftPresent(); err != nil {
			return err
		}
	}
	return nft.Commit(c, tx, commit)
}

func (k *netlinkKernel) Chain(f plan.Family, table, chain string) (*ChainState, error) {
	c, err := k.c()
	if err != nil {
		return nil, err
	}
	var get nfnl.Attrs
	get.String(unix.NFTA_CHAIN_TABLE, table).String(unix.NFTA_CHAIN_NAME, chain)
	reqs := []nfnl.Msg{{Type: nfnl.NftType(unix.NFT_MSG_GETCHAIN), Family: nft.Family(f).Proto(), Attrs: get.Bytes()}}
	owner := ownerKey(chain)
	if table == Table && owner != nil {
		// in the same round trip: whether the owners map holds it
		var a nfnl.Attrs
		ownerObj{chain}.element().Attrs(&a, table, false)
		reqs = append(reqs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETSETELEM), Family: nft.Family(f).Proto(), Attrs: a.Bytes()})
	}
	replies, errs, err := c.Get(reqs)
	if err == nil {
		err = errs[0]
	}
	if nft.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, &nft.Error{Op: "get chain " + chain, Err: err}
	}
	ud, _ := nfnl.Find(replies[0].Attrs, nft.AttrChainUserdata)
	cs := &ChainState{Comment: nft.CommentOf(ud)}
	if len(reqs) > 1 {
		if errs[1] != nil && !nft.IsNotFound(errs[1]) {
			return nil, &nft.Error{Op: "get element of map " + ownersMap, Err: errs[1]}
		}
		cs.Owned = errs[1] == nil // its key is the chain's name
	}
	var dump nfnl.Attrs
	dump.String(unix.NFTA_RULE_TABLE, table).String(unix.NFTA_RULE_CHAIN, chain)
	rules, err := c.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETRULE), Family: nft.Family(f).Proto(), Attrs: dump.Bytes()})
	if err != nil {
		return nil, &nft.Error{Op: "list rules of chain " + chain, Err: err}
	}
	for _, r := range rules {
		cs.Rules = append(cs.Rules, decodeRule(f, r.Attrs))
	}
	if err := readDNATs(c, f, table, cs.Rules); err != nil {
		return nil, err
	}
	if table == Table {
		cs.splitClaims()
	}
	return cs, nil
}

// readDNATs fills in the elements of the rules' DNAT maps, one dump of
// each map.
func readDNATs(c nft.Conn, f plan.Family, table string, rules []RuleState) error {
	for i := range rules {
		r := &rules[i]
		if !strings.HasPrefix(r.DNATMap, "__") {
			continue // none, or a named map: the dispatch chain's, read apart
		}
		msgs, err := dumpSet(c, f, table, r.DNATMap)
		if err != nil {
			return &nft.Error{Op: "list map " + r.DNATMap, Err: err}
		}
		for _, m := range msgs {
			r.DNATs = append(r.DNATs, decodeDNATs(f, m.Attrs)...)
		}
	}
	return nil
}

// holdersByDump is the number of keys above which Elements reads the maps
// whole instead of one element at a time: the kernel answers each
// element get with a message of its own (a read each, ~14 µs here), and
// packs a dump's elements some hundred to a message, so past this many
// keys a dump costs less even on a node with thousands of elements.
const holdersByDump = 128

func (k *netlinkKernel) Elements(f plan.Family, keys []Key) ([]Element, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	c, err := k.c()
	if err != nil {
		return nil, err
	}
	maps := map[string]bool{}
	byDump := len(keys) > holdersByDump
	for _, key := range keys {
		maps[key.Map()] = true
		if key.IsRange() {
			// an interval key's class: the maps of its host IP kind
			// whose keys of one port shadow it, exact and flat
			byDump = true
			maps[Key{HostIP: key.HostIP}.Map()] = true
			maps[Key{HostIP: key.HostIP, Flat: true}.Map()] = true
		}
	}
	if byDump {
		var all []Element
		for _, name := range []string{hostIPPortsMap, hostIPPortRangesMap, hostPortsMap, hostPortRangesMap, hostIPDNATMap, HostDNATMap} {
			if !maps[name] {
				continue
			}
			els, err := dumpElements(c, f, name)
			if err != nil {
				return nil, err
			}
			all = append(all, els...)
		}
		return elementsFor(keys, all), nil
	}
	_, out, err := getElements(c, f, nil, nil, keys)
	return out, err
}

// getElements reads, in one round trip, which of chains and sets are
// missing and the elements of keys (of one port each) that exist; a
// missing map holds none.
func getElements(c nft.Conn, f plan.Family, chains, sets []string, keys []Key) (missing []string, out []Element, err error) {
	reqs := make([]nfnl.Msg, 0, len(chains)+len(sets)+len(keys))
	for _, name := range chains {
		var a nfnl.Attrs
		a.String(unix.NFTA_CHAIN_TABLE, Table).String(unix.NFTA_CHAIN_NAME, name)
		reqs = append(reqs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETCHAIN), Family: nft.Family(f).Proto(), Attrs: a.Bytes()})
	}
	for _, name := range sets {
		var a nfnl.Attrs
		a.String(unix.NFTA_SET_TABLE, Table).String(unix.NFTA_SET_NAME, name)
		reqs = append(reqs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETSET), Family: nft.Family(f).Proto(), Attrs: a.Bytes()})
	}
	chains = append(chains[:len(chains):len(chains)], sets...)
	for _, key := range keys {
		var a nfnl.Attrs
		Element{Key: key}.element(nft.Family(f)).Attrs(&a, Table, false)
		reqs = append(reqs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETSETELEM), Family: nft.Family(f).Proto(), Attrs: a.Bytes()})
	}
	if len(reqs) == 0 {
		return nil, nil, nil
	}
	replies, errs, err := c.Get(reqs)
	if err != nil {
		return nil, nil, err
	}
	for i, name := range chains {
		if nft.IsNotFound(errs[i]) {
			missing = append(missing, name)
		} else if errs[i] != nil {
			return nil, nil, &nft.Error{Op: "get " + name, Err: errs[i]}
		}
	}
	for j, key := range keys {
		i := len(chains) + j
		if nft.IsNotFound(errs[i]) {
			continue
		}
		if errs[i] != nil {
			return nil, nil, &nft.Error{Op: "get element " + key.String() + " of map " + key.Map(), Err: errs[i]}
		}
		out = append(out, decodeElements(f, replies[i].Attrs)...)
	}
	return missing, out, nil
}

// Probe reads chains, sets and elements in one round trip (Kernel.Probe).
func (k *netlinkKernel) Probe(f plan.Family, chains, sets []string, keys []Key) ([]string, []Element, error) {
	c, err := k.c()
	if err != nil {
		return nil, nil, err
	}
	return getElements(c, f, chains, sets, keys)
}

// Hairpins gets the hairpin elements hs names, one get each.
func (k *netlinkKernel) Hairpins(f plan.Family, points []Hairpin) ([]Hairpin, error) {
	c, err := k.c()
	if err != nil {
		return nil, err
	}
	reqs := make([]nfnl.Msg, len(points))
	for i, h := range points {
		var a nfnl.Attrs
		hairpinObj{h}.element(nft.Family(f)).Attrs(&a, Table, false)
		reqs[i] = nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETSETELEM), Family: nft.Family(f).Proto(), Attrs: a.Bytes()}
	}
	replies, errs, err := c.Get(reqs)
	if err != nil {
		return nil, err
	}
	var out []Hairpin
	for i, h := range points {
		if nft.IsNotFound(errs[i]) {
			continue
		}
		if errs[i] != nil {
			return nil, &nft.Error{Op: "get element " + h.Src + " . " + h.Key.String() + " of set " + h.set(), Err: errs[i]}
		}
		out = append(out, decodeHairpins(f, replies[i].Attrs)...)
	}
	return out, nil
}

func (k *netlinkKernel) Table(f plan.Family, table string) (*State, error) {
	c, err := k.c()
	if err != nil {
		return nil, err
	}
	fam := nft.Family(f).Proto()
	var get nfnl.Attrs
	get.String(unix.NFTA_TABLE_NAME, table)
	_, err = c.GetOne(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETTABLE), Family: fam, Attrs: get.Bytes()})
	if nft.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, &nft.Error{Op: "get table " + table, Err: err}
	}
	s := newState()
	chains, err := nft.DumpTable(c, nft.Family(f), unix.NFT_MSG_GETCHAIN, table)
	if err != nil {
		return nil, &nft.Error{Op: "list chains", Err: err}
	}
	for _, attrs := range chains {
		ud, _ := attrs.Find(nft.AttrChainUserdata)
		s.Chains[attrs.String(unix.NFTA_CHAIN_NAME)] = &ChainState{Comment: nft.CommentOf(ud)}
	}
	rules, err := nft.DumpTable(c, nft.Family(f), unix.NFT_MSG_GETRULE, table)
	if err != nil {
		return nil, &nft.Error{Op: "list rules", Err: err}
	}
	for _, attrs := range rules {
		if cs := s.Chains[attrs.String(unix.NFTA_RULE_CHAIN)]; cs != nil {
			cs.Rules = append(cs.Rules, decodeAttrs(f, attrs))
		}
	}
	for _, cs := range s.Chains {
		if err := readDNATs(c, f, table, cs.Rules); err != nil {
			return nil, err
		}
		if table == Table {
			cs.splitClaims()
		}
	}
	sets, err := nft.DumpTable(c, nft.Family(f), unix.NFT_MSG_GETSET, table)
	if err != nil {
		return nil, &nft.Error{Op: "list maps", Err: err}
	}
	for _, attrs := range sets {
		name := attrs.String(unix.NFTA_SET_NAME)
		s.Maps[name] = true
		if table != Table {
			continue
		}
		if name == ownersMap {
			msgs, err := dumpSet(c, f, table, name)
			if err != nil {
				return nil, &nft.Error{Op: "list map " + name, Err: err}
			}
			for _, m := range msgs {
				for _, ch := range decodeOwners(m.Attrs) {
					if cs := s.Chains[ch]; cs != nil {
						cs.Owned = true
					}
				}
			}
			continue
		}
		if _, _, ok := hairpinLength(name); ok {
			msgs, err := dumpSet(c, f, table, name)
			if err != nil {
				return nil, &nft.Error{Op: "list set " + name, Err: err}
			}
			for _, m := range msgs {
				s.Hairpins = append(s.Hairpins, decodeHairpins(f, m.Attrs)...)
			}
			continue
		}
		if !isDispatchMap(name) && !isDNATMap(name) {
			continue
		}
		els, err := dumpElements(c, f, name)
		if err != nil {
			return nil, err
		}
		for _, e := range els {
			s.Elements[e.Key] = e
		}
	}
	return s, nil
}
