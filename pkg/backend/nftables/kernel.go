package nftables

import (
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// netlinkKernel is nf_tables over netlink, one socket for the life of the
// backend (or NewOn's Conn). Only conditions (nft syntax) run nft.
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

// holdersByDump is the number of gets above which Read dumps the maps
// instead: each get is a message of its own (~14 µs here), a dump packs
// some hundred elements to a message.
const holdersByDump = 128

func (k *netlinkKernel) Read(f plan.Family, q Query) (*State, error) {
	c, err := k.c()
	if err != nil {
		return nil, err
	}
	fam := nft.Family(f).Proto()
	st := newState()
	var reqs []nfnl.Msg
	var takes []func(nfnl.Reply, error) error
	ask := func(t int, a *nfnl.Attrs, take func(nfnl.Reply, error) error) {
		reqs = append(reqs, nfnl.Msg{Type: nfnl.NftType(t), Family: fam, Attrs: a.Bytes()})
		takes = append(takes, take)
	}
	// exists asks whether the chain or set name is there; missing says
	// it is not
	exists := func(t int, table, name uint16, what string, there func(nfnl.Reply), missing func()) {
		var a nfnl.Attrs
		a.String(table, Table).String(name, what)
		ask(t, &a, func(r nfnl.Reply, err error) error {
			switch {
			case nft.IsNotFound(err):
				missing()
			case err != nil:
				return &nft.Error{Op: "get " + what, Err: err}
			default:
				there(r)
			}
			return nil
		})
	}
	// element asks for one element, whose absence is no error
	element := func(e *nft.Element, what string, take func(r nfnl.Reply, found bool)) {
		var a nfnl.Attrs
		e.Attrs(&a, Table, false)
		ask(unix.NFT_MSG_GETSETELEM, &a, func(r nfnl.Reply, err error) error {
			if err != nil && !nft.IsNotFound(err) {
				return &nft.Error{Op: "get " + what, Err: err}
			}
			take(r, err == nil)
			return nil
		})
	}
	for _, name := range q.Chains {
		exists(unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME, name, func(r nfnl.Reply) {
			ud, _ := nfnl.Find(r.Attrs, nft.AttrChainUserdata)
			st.Chains[name] = &ChainState{Comment: nft.CommentOf(ud)}
		}, func() {})
		if ownerKey(name) != nil {
			// whether the owners map holds it (its key is the chain's name)
			element(ownerObj{name}.element(), "element of map "+ownersMap, func(_ nfnl.Reply, found bool) {
				if cs := st.Chains[name]; cs != nil {
					cs.Owned = found
				}
			})
		}
	}
	missing := func(name string) func() { return func() { st.Missing = append(st.Missing, name) } }
	for _, name := range q.Probe {
		exists(unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME, name, func(nfnl.Reply) {}, missing(name))
	}
	for _, name := range q.Sets {
		exists(unix.NFT_MSG_GETSET, unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME, name, func(nfnl.Reply) {}, missing(name))
	}
	// An interval key: its interval map dumped, and gets of its ports and
	// the port on either side in both maps of one port (a cut leaves a
	// one-port piece of another interval right beside it), or dumps of
	// those maps past holdersByDump gets.
	byDump := map[string]bool{}
	var gets []Key
	for _, key := range q.Keys {
		if !key.IsRange() {
			gets = append(gets, key)
			continue
		}
		byDump[key.Map()] = true
		for port := max(key.Port-1, 1); port <= min(key.Last+1, 65535); port++ {
			one := Key{HostIP: key.HostIP, Protocol: key.Protocol, Port: port}
			gets = append(gets, one, one.inOtherMap())
		}
	}
	if gets = uniqueKeys(gets); len(gets) > holdersByDump {
		for _, key := range q.Keys {
			byDump[key.Map()] = true
			if key.IsRange() {
				byDump[Key{HostIP: key.HostIP}.Map()] = true
				byDump[Key{HostIP: key.HostIP, Flat: true}.Map()] = true
			}
		}
		gets = nil
	}
	var els []Element
	for _, key := range gets {
		element(Element{Key: key}.element(nft.Family(f)), "element "+key.String()+" of map "+key.Map(), func(r nfnl.Reply, found bool) {
			if found {
				els = append(els, decodeElements(f, r.Attrs)...)
			}
		})
	}
	for _, h := range q.Hairpins {
		element(hairpinObj{h}.element(nft.Family(f)), "element "+h.Src+" . "+h.Key.String()+" of set "+h.set(), func(r nfnl.Reply, found bool) {
			if found {
				st.Hairpins = append(st.Hairpins, decodeHairpins(f, r.Attrs)...)
			}
		})
	}
	if len(reqs) > 0 {
		replies, errs, err := c.Get(reqs)
		if err != nil {
			return nil, err
		}
		for i, take := range takes {
			if err := take(replies[i], errs[i]); err != nil {
				return nil, err
			}
		}
	}
	for _, name := range q.Chains {
		if cs := st.Chains[name]; cs != nil {
			var dump nfnl.Attrs
			dump.String(unix.NFTA_RULE_TABLE, Table).String(unix.NFTA_RULE_CHAIN, name)
			rules, err := c.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETRULE), Family: fam, Attrs: dump.Bytes()})
			if err != nil {
				return nil, &nft.Error{Op: "list rules of chain " + name, Err: err}
			}
			for _, r := range rules {
				cs.Rules = append(cs.Rules, decodeRule(f, nfnl.Parse(r.Attrs)))
			}
			if err := readChain(c, f, Table, cs); err != nil {
				return nil, err
			}
		}
	}
	if len(byDump) > 0 {
		var all []Element
		for _, name := range []string{hostIPPortsMap, hostIPPortRangesMap, hostPortsMap, hostPortRangesMap, hostIPDNATMap, HostDNATMap} {
			if byDump[name] {
				more, err := dumpElements(c, f, name)
				if err != nil {
					return nil, err
				}
				all = append(all, more...)
			}
		}
		els = append(els, elementsFor(q.Keys, all)...)
	}
	for _, e := range els {
		st.Elements[e.Key] = e
	}
	return st, nil
}

// readChain completes a chain read with its rules: the elements of its
// rules' DNAT maps and, in our table, its claims apart from its rules.
func readChain(c nft.Conn, f plan.Family, table string, cs *ChainState) error {
	for i := range cs.Rules {
		r := &cs.Rules[i]
		for _, l := range r.Lookups() {
			if !l.Data || !strings.HasPrefix(l.Set, "__") {
				continue // a named map: the dispatch chain's, read apart
			}
			msgs, err := dumpSet(c, f, table, l.Set)
			if err != nil {
				return &nft.Error{Op: "list map " + l.Set, Err: err}
			}
			for _, m := range msgs {
				r.DNATs = append(r.DNATs, decodeDNATs(f, m.Attrs)...)
			}
		}
	}
	if table == Table {
		cs.splitClaims()
	}
	return nil
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
			cs.Rules = append(cs.Rules, decodeRule(f, attrs))
		}
	}
	for _, cs := range s.Chains {
		if err := readChain(c, f, table, cs); err != nil {
			return nil, err
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
