package nftables

import (
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/portmap-dev/portmap/pkg/nft"
)

// Interval keys. An identity run of ports (a Podman range) is one element
// of an interval map, looked up after the exact maps, so a key of one
// port shadows an interval that covers it. Ownership stays per port: ADD
// takes over every port of its intervals (an element of one port inside
// is deleted; an interval sharing ports is deleted and what is left of
// it added back for its owner), DEL deletes only what names its chain,
// CHECK follows each port as the dispatch chain would. The kernel's
// interval map (pipapo) refuses an interval whose ends fall inside
// another, but not one covering another whole, so ADD reads what shares
// its ports before it writes.

// sameClass reports whether a and b are keys of the same host IP and
// protocol: the keys that can share a port.
func sameClass(a, b Key) bool { return classOf(a) == classOf(b) }

// overlaps reports whether a and b share a port.
func overlaps(a, b Key) bool {
	return sameClass(a, b) && a.Port <= b.last() && b.Port <= a.last()
}

func overlapsAny(k Key, ks []Key) bool {
	for _, o := range ks {
		if overlaps(k, o) {
			return true
		}
	}
	return false
}

// subtract is what is left of k's ports outside those of cut (keys of
// k's class), as keys: intervals, or keys of one port.
func subtract(k Key, cut []Key) []Key {
	var holes []Key
	for _, c := range cut {
		if overlaps(k, c) {
			holes = append(holes, c)
		}
	}
	sort.Slice(holes, func(i, j int) bool { return holes[i].Port < holes[j].Port })
	var out []Key
	from := k.Port
	emit := func(to int) {
		if to < from {
			return
		}
		p := Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: from}
		if to > from {
			p.Last = to
		}
		out = append(out, p)
	}
	for _, h := range holes {
		emit(min(h.Port-1, k.last()))
		from = max(from, h.last()+1)
	}
	emit(k.last())
	return out
}

// view answers, from elements read, which element the dispatch chain
// finds for a port: the element of that one port, else an interval of
// its class holding it. It is read-only once built.
type view struct {
	exact     map[portKey]Element
	intervals map[Key][]Element // by class
	// ports are the ports of exact's elements by class, sorted.
	ports map[Key][]int
}

type portKey struct {
	class Key
	port  int
}

// classOf is k's class: its host IP and protocol, the keys that can
// share a port.
func classOf(k Key) Key { return Key{HostIP: k.HostIP, Protocol: k.Protocol} }

func newView(els []Element) *view {
	v := &view{exact: make(map[portKey]Element, len(els)), intervals: map[Key][]Element{}, ports: map[Key][]int{}}
	for _, e := range els {
		c := classOf(e.Key)
		if e.Key.IsRange() {
			v.intervals[c] = append(v.intervals[c], e)
		} else {
			v.exact[portKey{c, e.Key.Port}] = e
			v.ports[c] = append(v.ports[c], e.Key.Port)
		}
	}
	for _, ps := range v.ports {
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	}
	return v
}

// nextExact is the first port of class c from port on that an exact
// element holds, or -1.
func (v *view) nextExact(c Key, port int) int {
	ps := v.ports[c]
	if i, _ := slices.BinarySearch(ps, port); i < len(ps) {
		return ps[i]
	}
	return -1
}

// at is the element the dispatch finds for port in class c.
func (v *view) at(c Key, port int) (Element, bool) {
	if e, ok := v.exact[portKey{c, port}]; ok {
		return e, true
	}
	for _, e := range v.intervals[c] {
		if e.Key.Port <= port && port <= e.Key.Last {
			return e, true
		}
	}
	return Element{}, false
}

// missingPort says which port of interval key k that chain should hold
// (wins: not those a newer attachment took over) does not reach chain,
// or "".
func (v *view) missingPort(k Key, chain string, wins func(Key) bool) string {
	c := classOf(k)
	for port := k.Port; port <= k.Last; port++ {
		one := Key{HostIP: k.HostIP, Protocol: k.Protocol, Port: port}
		if !wins(one) {
			continue
		}
		e, ok := v.at(c, port)
		if ok && e.Chain == chain {
			if e.Key.IsRange() {
				// the interval serves the ports up to its end, but for
				// those an exact element holds: go on at the first of them
				next := min(e.Key.Last, k.Last) + 1
				if x := v.nextExact(c, port+1); x >= 0 && x < next {
					next = x
				}
				port = next - 1
			}
			continue
		}
		if !ok {
			return fmt.Sprintf("missing element %s in map %s (to %s)", one, k.Map(), chain)
		}
		return fmt.Sprintf("map %s sends %s to %s, not to %s", e.Key.Map(), one, e.Chain, chain)
	}
	return ""
}

// place writes into tx what makes l's chain hold its elements: a pass's
// repair of one attachment that wins every port it asks for, over els
// (what Kernel.Read returns for its keys and those the chain held) and
// hps (their hairpin elements). Each takeover is logged to log.
func place(tx *nft.Tx, l *layout, els []Element, hps []Hairpin, log io.Writer) {
	s := &syncState{layouts: []*layout{l}, st: newState(), hairpins: map[hairpinID]Hairpin{}}
	for _, e := range els {
		s.st.Elements[e.Key] = e
	}
	for _, h := range hps {
		s.hairpins[h.id()] = h
	}
	desired, wantHP := s.desiredElements(map[int]bool{0: true})
	cutIntervals(s.st, els, desired)
	for _, e := range els {
		if d, ok := desired[e.Key]; ok && e.Chain != l.chain.Name && d.Chain != e.Chain {
			fmt.Fprintf(log, "portmap: %s %s was forwarded by chain %s; %s takes it over\n", tx.Family, e.Key, e.Chain, l.chain.Name)
		}
	}
	writeElements(tx, s.st, desired)
	s.writeHairpins(tx, desired, wantHP)
}

// elementsFor is what Kernel.Read returns for keys out of the elements
// of the maps it read whole: for a key of one port its own element, for
// an interval key every element of its class.
func elementsFor(keys []Key, all []Element) []Element {
	exact := map[Key]bool{}
	var intervals []Key
	for _, k := range keys {
		if k.IsRange() {
			intervals = append(intervals, k)
		} else {
			exact[k] = true
		}
	}
	var out []Element
	for _, e := range all {
		if exact[e.Key] || inClassOf(e.Key, intervals) {
			out = append(out, e)
		}
	}
	return out
}

func inClassOf(k Key, ks []Key) bool {
	for _, o := range ks {
		if sameClass(k, o) {
			return true
		}
	}
	return false
}
