package nfttest

import (
	"encoding/binary"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// Get answers requests one by one, as the kernel does: each its reply or
// its error (ENOENT for what does not exist).
func (k *Kernel) Get(reqs []nfnl.Msg) ([]nfnl.Reply, []error, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	replies, errs := make([]nfnl.Reply, len(reqs)), make([]error, len(reqs))
	for i, m := range reqs {
		attrs, errno := k.get(m)
		if errno != 0 {
			errs[i] = &nfnl.Error{Index: i, Errno: errno}
			continue
		}
		replies[i] = nfnl.Reply{Type: m.Type, Family: m.Family, Attrs: attrs}
	}
	return replies, errs, nil
}

// GetOne is Get of one request.
func (k *Kernel) GetOne(m nfnl.Msg) (nfnl.Reply, error) {
	replies, errs, err := k.Get([]nfnl.Msg{m})
	if err != nil {
		return nfnl.Reply{}, err
	}
	return replies[0], errs[0]
}

func (k *Kernel) get(m nfnl.Msg) ([]byte, unix.Errno) {
	if m.Type>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return nil, unix.EINVAL
	}
	t := func(attr uint16) *table { return k.tables[tableKey{m.Family, str(m.Attrs, attr)}] }
	switch int(m.Type & 0xff) {
	case unix.NFT_MSG_GETTABLE:
		if tb := t(unix.NFTA_TABLE_NAME); tb != nil {
			return tb.attrs, 0
		}
	case unix.NFT_MSG_GETCHAIN:
		if tb := t(unix.NFTA_CHAIN_TABLE); tb != nil {
			if _, c := tb.chain(str(m.Attrs, unix.NFTA_CHAIN_NAME)); c != nil {
				return c.attrs, 0
			}
		}
	case unix.NFT_MSG_GETSET:
		if tb := t(unix.NFTA_SET_TABLE); tb != nil {
			if _, s := tb.set(str(m.Attrs, unix.NFTA_SET_NAME)); s != nil {
				return s.attrs, 0
			}
		}
	case unix.NFT_MSG_GETSETELEM:
		tb := t(unix.NFTA_SET_ELEM_LIST_TABLE)
		if tb == nil {
			return nil, unix.ENOENT
		}
		_, s := tb.set(str(m.Attrs, unix.NFTA_SET_ELEM_LIST_SET))
		if s == nil {
			return nil, unix.ENOENT
		}
		list, _ := nfnl.Find(m.Attrs, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		var found []*element
		for a := range nfnl.All(list) {
			e := s.holding(nft.ValueOf(a.Value, unix.NFTA_SET_ELEM_KEY))
			if e == nil {
				return nil, unix.ENOENT
			}
			found = append(found, e)
		}
		return elementsReply(m.Attrs, s, found), 0
	default:
		return nil, unix.EOPNOTSUPP
	}
	return nil, unix.ENOENT
}

// holding is the element whose key is key or, in an interval set, whose
// interval holds it.
func (s *set) holding(key []byte) *element {
	for _, e := range s.elements {
		if string(e.key) == string(key) {
			return e
		}
		if s.flags&unix.NFT_SET_INTERVAL != 0 && overlap(e, &element{key: key}) {
			return e
		}
	}
	return nil
}

// elementsReply is a GETSETELEM answer: the table, the set, and els.
func elementsReply(req []byte, s *set, els []*element) []byte {
	var a nfnl.Attrs
	a.String(unix.NFTA_SET_ELEM_LIST_TABLE, str(req, unix.NFTA_SET_ELEM_LIST_TABLE))
	a.String(unix.NFTA_SET_ELEM_LIST_SET, s.name)
	a.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
		for _, e := range els {
			a.Raw(unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, e.attrs)
		}
	})
	return a.Bytes()
}

// Dump answers a dump of the family's chains, rules or sets (of the
// table its table attribute names, or of all) or of one set's elements
// (ENOENT where the set is not).
func (k *Kernel) Dump(req nfnl.Msg) ([]nfnl.Reply, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	typ := int(req.Type & 0xff)
	if typ == unix.NFT_MSG_GETSETELEM {
		tb := k.tables[tableKey{req.Family, str(req.Attrs, unix.NFTA_SET_ELEM_LIST_TABLE)}]
		if tb == nil {
			return nil, &nfnl.Error{Errno: unix.ENOENT}
		}
		_, s := tb.set(str(req.Attrs, unix.NFTA_SET_ELEM_LIST_SET))
		if s == nil {
			return nil, &nfnl.Error{Errno: unix.ENOENT}
		}
		k.Listed += len(s.elements)
		return []nfnl.Reply{{Type: req.Type, Family: req.Family, Attrs: elementsReply(req.Attrs, s, s.elements)}}, nil
	}
	tableAttr := map[int]uint16{unix.NFT_MSG_GETCHAIN: unix.NFTA_CHAIN_TABLE, unix.NFT_MSG_GETRULE: unix.NFTA_RULE_TABLE,
		unix.NFT_MSG_GETSET: unix.NFTA_SET_TABLE}[typ]
	if tableAttr == 0 {
		return nil, &nfnl.Error{Errno: unix.EOPNOTSUPP}
	}
	want := str(req.Attrs, tableAttr)
	var names []string
	for key := range k.tables {
		if key.family == req.Family && (want == "" || key.name == want) {
			names = append(names, key.name)
		}
	}
	slices.Sort(names)
	var out []nfnl.Reply
	reply := func(attrs []byte) { out = append(out, nfnl.Reply{Type: req.Type, Family: req.Family, Attrs: attrs}) }
	for _, name := range names {
		t := k.tables[tableKey{req.Family, name}]
		switch typ {
		case unix.NFT_MSG_GETCHAIN:
			for _, c := range t.chains {
				reply(c.attrs)
			}
		case unix.NFT_MSG_GETSET:
			for _, s := range t.sets {
				reply(s.attrs)
			}
		case unix.NFT_MSG_GETRULE:
			only := str(req.Attrs, unix.NFTA_RULE_CHAIN)
			for _, c := range t.chains {
				if only != "" && c.name != only {
					continue
				}
				for _, r := range c.rules {
					reply(withHandle(r))
				}
			}
		}
	}
	return out, nil
}

// withHandle is a rule's attributes as a dump gives them: with its
// handle.
func withHandle(r *rule) []byte {
	var h nfnl.Attrs
	h.Raw(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, r.handle))
	return append(slices.Clip(r.attrs), h.Bytes()...)
}
