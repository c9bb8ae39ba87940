package nfttest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// How each message of a batch changes the tables, with the errno the
// kernel answers where it refuses.

func (b *batch) apply(m nfnl.Msg) unix.Errno {
	if m.Type>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return unix.EINVAL
	}
	excl := m.Flags&unix.NLM_F_EXCL != 0
	tk := func(attr uint16) tableKey { return tableKey{m.Family, str(m.Attrs, attr)} }
	switch int(m.Type & 0xff) {
	case unix.NFT_MSG_NEWTABLE:
		key := tk(unix.NFTA_TABLE_NAME)
		if b.tables[key] != nil {
			return errIf(excl, unix.EEXIST)
		}
		b.tables[key] = &table{attrs: m.Attrs}
		return 0
	case unix.NFT_MSG_DELTABLE:
		key := tk(unix.NFTA_TABLE_NAME)
		if b.tables[key] == nil {
			return unix.ENOENT
		}
		delete(b.tables, key)
		return 0
	case unix.NFT_MSG_NEWCHAIN:
		return b.newChain(b.tables[tk(unix.NFTA_CHAIN_TABLE)], m.Attrs, excl)
	case unix.NFT_MSG_DELCHAIN:
		return b.delChain(b.tables[tk(unix.NFTA_CHAIN_TABLE)], str(m.Attrs, unix.NFTA_CHAIN_NAME))
	case unix.NFT_MSG_NEWRULE:
		return b.newRule(b.tables[tk(unix.NFTA_RULE_TABLE)], m.Attrs)
	case unix.NFT_MSG_DELRULE:
		return b.delRule(b.tables[tk(unix.NFTA_RULE_TABLE)], m.Attrs)
	case unix.NFT_MSG_NEWSET:
		return b.newSet(b.tables[tk(unix.NFTA_SET_TABLE)], m.Attrs, excl)
	case unix.NFT_MSG_DELSET:
		return b.delSet(b.tables[tk(unix.NFTA_SET_TABLE)], str(m.Attrs, unix.NFTA_SET_NAME))
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		t := b.tables[tk(unix.NFTA_SET_ELEM_LIST_TABLE)]
		if t == nil {
			return unix.ENOENT
		}
		name := str(m.Attrs, unix.NFTA_SET_ELEM_LIST_SET)
		if id := nfnl.FindU32(m.Attrs, unix.NFTA_SET_ELEM_LIST_SET_ID); id != 0 && b.ids[id] != "" {
			name = b.ids[id]
		}
		_, s := t.set(name)
		if s == nil {
			return unix.ENOENT
		}
		list, _ := nfnl.Find(m.Attrs, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		for a := range nfnl.All(list) {
			var errno unix.Errno
			if m.Type&0xff == unix.NFT_MSG_NEWSETELEM {
				errno = newElement(t, s, a.Value, excl)
			} else {
				errno = delElement(s, a.Value)
			}
			if errno != 0 {
				return errno
			}
		}
		return 0
	}
	return unix.EOPNOTSUPP
}

func errIf(cond bool, errno unix.Errno) unix.Errno {
	if cond {
		return errno
	}
	return 0
}

func (b *batch) newChain(t *table, attrs []byte, excl bool) unix.Errno {
	if t == nil {
		return unix.ENOENT
	}
	name := str(attrs, unix.NFTA_CHAIN_NAME)
	if _, c := t.chain(name); c != nil {
		return errIf(excl, unix.EEXIST)
	}
	t.chains = append(t.chains, &chain{name: name, attrs: attrs})
	return 0
}

func (b *batch) delChain(t *table, name string) unix.Errno {
	if t == nil {
		return unix.ENOENT
	}
	i, c := t.chain(name)
	if c == nil {
		return unix.ENOENT
	}
	if len(c.rules) > 0 || t.refs(name) > 0 {
		return unix.EBUSY
	}
	t.chains = slices.Delete(t.chains, i, i+1)
	return 0
}

func (b *batch) newRule(t *table, attrs []byte) unix.Errno {
	if t == nil {
		return unix.ENOENT
	}
	_, c := t.chain(str(attrs, unix.NFTA_RULE_CHAIN))
	if c == nil {
		return unix.ENOENT
	}
	r := &rule{}
	var errno unix.Errno
	r.attrs = rewriteLookups(attrs, func(name string, id uint32) string {
		if id != 0 && b.ids[id] != "" {
			name = b.ids[id]
		}
		if _, s := t.set(name); s == nil {
			errno = unix.ENOENT
		}
		r.sets = append(r.sets, name)
		return name
	})
	if errno != 0 {
		return errno
	}
	_, r.jumps = nfnl.RuleJumps(r.attrs)
	for _, j := range r.jumps {
		if _, target := t.chain(j); target == nil {
			return unix.ENOENT
		}
	}
	b.handle++
	r.handle = b.handle
	c.rules = append(c.rules, r)
	return 0
}

func (b *batch) delRule(t *table, attrs []byte) unix.Errno {
	if t == nil {
		return unix.ENOENT
	}
	_, c := t.chain(str(attrs, unix.NFTA_RULE_CHAIN))
	if c == nil {
		return unix.ENOENT
	}
	if h, ok := nfnl.Find(attrs, unix.NFTA_RULE_HANDLE); ok && len(h) == 8 {
		j := slices.IndexFunc(c.rules, func(r *rule) bool { return r.handle == binary.BigEndian.Uint64(h) })
		if j < 0 {
			return unix.ENOENT
		}
		t.dropAnon(c.rules[j])
		c.rules = slices.Delete(c.rules, j, j+1)
	} else { // a flush of the chain
		for _, r := range c.rules {
			t.dropAnon(r)
		}
		c.rules = nil
	}
	return 0
}

// dropAnon deletes the anonymous sets r was the one user of.
func (t *table) dropAnon(r *rule) {
	t.sets = slices.DeleteFunc(t.sets, func(s *set) bool {
		return s.flags&unix.NFT_SET_ANONYMOUS != 0 && slices.Contains(r.sets, s.name)
	})
}

func (b *batch) newSet(t *table, attrs []byte, excl bool) unix.Errno {
	if t == nil {
		return unix.ENOENT
	}
	name, flags := str(attrs, unix.NFTA_SET_NAME), nfnl.FindU32(attrs, unix.NFTA_SET_FLAGS)
	if flags&unix.NFT_SET_ANONYMOUS != 0 {
		// the kernel names it from the template (__set%d, __map%d) with
		// the lowest number no set of the table has
		for n := 0; ; n++ {
			if _, s := t.set(strings.Replace(name, "%d", fmt.Sprint(n), 1)); s == nil {
				name = strings.Replace(name, "%d", fmt.Sprint(n), 1)
				break
			}
		}
	} else if _, s := t.set(name); s != nil {
		return errIf(excl, unix.EEXIST)
	}
	s := &set{name: name, attrs: replaceString(attrs, unix.NFTA_SET_NAME, name), flags: flags, id: nfnl.FindU32(attrs, unix.NFTA_SET_ID)}
	if s.id != 0 {
		b.ids[s.id] = name
	}
	t.sets = append(t.sets, s)
	return 0
}

func (b *batch) delSet(t *table, name string) unix.Errno {
	if t == nil {
		return unix.ENOENT
	}
	i, s := t.set(name)
	if s == nil {
		return unix.ENOENT
	}
	if t.lookedUp(name) {
		return unix.EBUSY
	}
	t.sets = slices.Delete(t.sets, i, i+1)
	return 0
}

func newElement(t *table, s *set, attrs []byte, excl bool) unix.Errno {
	e := &element{key: nft.ValueOf(attrs, unix.NFTA_SET_ELEM_KEY), end: nft.ValueOf(attrs, nft.AttrSetElemKeyEnd), attrs: attrs}
	e.data, _ = nfnl.Find(attrs, unix.NFTA_SET_ELEM_DATA)
	if vd, ok := nfnl.Find(e.data, unix.NFTA_DATA_VERDICT); ok {
		code, chain := nfnl.Verdict(vd)
		if code == unix.NFT_JUMP || code == unix.NFT_GOTO {
			if _, c := t.chain(chain); c == nil {
				return unix.ENOENT
			}
			e.chain = chain
		}
	}
	for _, o := range s.elements {
		if bytes.Equal(o.key, e.key) && bytes.Equal(o.end, e.end) {
			// the kernel compares the data, not the comment
			if excl || !bytes.Equal(o.data, e.data) {
				return unix.EEXIST
			}
			return 0
		}
		if s.flags&unix.NFT_SET_INTERVAL != 0 && overlap(o, e) {
			return unix.EEXIST
		}
	}
	s.elements = append(s.elements, e)
	return 0
}

// overlap reports whether two interval elements share a key; a key
// without an end is an interval of one.
func overlap(a, b *element) bool {
	last := func(e *element) []byte {
		if e.end != nil {
			return e.end
		}
		return e.key
	}
	return bytes.Compare(a.key, last(b)) <= 0 && bytes.Compare(b.key, last(a)) <= 0
}

func delElement(s *set, attrs []byte) unix.Errno {
	key := nft.ValueOf(attrs, unix.NFTA_SET_ELEM_KEY)
	i := slices.IndexFunc(s.elements, func(e *element) bool { return bytes.Equal(e.key, key) })
	if i < 0 {
		return unix.ENOENT
	}
	s.elements = slices.Delete(s.elements, i, i+1)
	return 0
}
