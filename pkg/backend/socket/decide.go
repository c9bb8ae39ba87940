package socket

import (
	"bytes"
	"cmp"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// The decisions of the socket path: pure functions from a site's state
// (its entries and owner entries) and the wanted plans to a Write; the
// site reads the state and applies the write (site.go).

// State is what one site holds of one namespace and family: its entries
// and its owner entries (each family keeps its own, so the two families'
// passes never race on one entry).
type State struct {
	Entries map[Key]Value
	Owners  map[uint64]plan.Owner
}

// Write is what one call changes: entries put and deleted, owner
// entries put and deleted.
type Write struct {
	Put       []Entry
	Delete    []Key
	PutOwners map[uint64]plan.Owner
	DelOwners []uint64
}

// Empty reports whether w changes nothing.
func (w *Write) Empty() bool {
	return len(w.Put) == 0 && len(w.Delete) == 0 && len(w.PutOwners) == 0 && len(w.DelOwners) == 0
}

// apply is ADD's write: p's entries take their keys unless an entry of
// a higher rank holds one (an exact host IP over a wildcard), and what
// the attachment held before in this family and is not wanted goes.
func apply(s *State, p *plan.Plan, netns uint64) *Write {
	w := &Write{}
	want := Entries(p, netns)
	id := OwnerID(p.Owner)
	wanted := make(map[Key]bool, len(want))
	gone := map[uint64]int{} // entries leaving each owner
	for _, e := range want {
		wanted[e.Key] = true
		if cur, ok := s.Entries[e.Key]; ok {
			if cur == e.Value || (cur.Owner != id && cur.Rank > e.Value.Rank) {
				continue
			}
			if cur.Owner != id {
				gone[cur.Owner]++ // taken over
			}
		}
		w.Put = append(w.Put, e)
	}
	for k, v := range s.Entries {
		if v.Owner == id && k.Family() == p.Family && !wanted[k] {
			w.Delete = append(w.Delete, k)
			gone[id]++
		}
	}
	if len(w.Put) > 0 {
		delete(gone, id)
		if o, ok := s.Owners[id]; !ok || o != p.Owner {
			w.PutOwners = map[uint64]plan.Owner{id: p.Owner}
		}
	}
	w.DelOwners = ownersEmptied(s, gone)
	return w
}

// remove is DEL's write: the entries of family f the owner holds.
func remove(s *State, o plan.Owner, f plan.Family) *Write {
	w := &Write{}
	id := OwnerID(o)
	for k, v := range s.Entries {
		if v.Owner == id && k.Family() == f {
			w.Delete = append(w.Delete, k)
		}
	}
	w.DelOwners = ownersEmptied(s, map[uint64]int{id: len(w.Delete)})
	return w
}

func ownerGone(s *State, id uint64) []uint64 {
	if _, ok := s.Owners[id]; ok {
		return []uint64{id}
	}
	return nil
}

// check names the first of p's entries that does not send its key to
// the container: missing, wrong, or taken by another attachment of the
// same or a lower rank. A key held by a higher rank is served by that
// mapping, as the NAT path's exact host IP shadows a wildcard.
func check(s *State, p *plan.Plan, netns uint64) error {
	id := OwnerID(p.Owner)
	for _, e := range Entries(p, netns) {
		cur, ok := s.Entries[e.Key]
		switch {
		case !ok:
			return fmt.Errorf("socket path: no entry for %s", e.Key)
		case cur.Owner != id && cur.Rank > e.Value.Rank:
			continue
		case cur.Owner != id:
			return fmt.Errorf("socket path: %s goes to %s of %s", e.Key, cur.Target(), ownerName(s, cur.Owner))
		case cur != e.Value:
			return fmt.Errorf("socket path: %s goes to %s, want %s", e.Key, cur.Target(), e.Value.Target())
		}
	}
	return nil
}

func ownerName(s *State, id uint64) string {
	if o, ok := s.Owners[id]; ok {
		return fmt.Sprintf("container %s (network %s)", o.ContainerID, o.Network)
	}
	return fmt.Sprintf("unknown attachment %016x", id)
}

// gc is GC's write: entries of family f in network that no attachment of
// valid owns.
func gc(s *State, network string, valid []plan.Owner, f plan.Family) *Write {
	w := &Write{}
	keep := map[uint64]bool{}
	for _, o := range valid {
		keep[OwnerID(o)] = true
	}
	nid := NetworkID(network)
	gone := map[uint64]int{}
	for k, v := range s.Entries {
		if v.Network == nid && !keep[v.Owner] && k.Family() == f {
			w.Delete = append(w.Delete, k)
			gone[v.Owner]++
		}
	}
	w.DelOwners = ownersEmptied(s, gone)
	return w
}

// ownersEmptied lists the owner entries whose every entry is in gone
// (owner → entries deleted).
func ownersEmptied(s *State, gone map[uint64]int) []uint64 {
	if len(gone) == 0 {
		return nil
	}
	left := map[uint64]int{}
	for _, v := range s.Entries {
		left[v.Owner]++
	}
	var out []uint64
	for id, n := range gone {
		if left[id] == n {
			out = append(out, ownerGone(s, id)...)
		}
	}
	return out
}

// entryDiff is what a `portmap-agent sync` pass finds of family f's entries:
// every key goes to the wanted plan (oldest first) that wins it — the
// highest rank, then the newest — entries of wanted owners that no
// longer win a key go, and entries of owners no plan wants are orphans.
// Keys that are right are not written, so a pass after a pass writes
// nothing.
type entryDiff struct {
	put   []Entry // keys a wanted plan wins that hold something else
	stale []Key   // entries of wanted owners that win no key
	whys  []string
	// orphans are the keys of owners no plan wants, sorted.
	orphans []Key
}

// diffEntries compares the entries of s with the wanted plans.
func diffEntries(s *State, want []*plan.Plan, netns uint64, f plan.Family) entryDiff {
	type claim struct {
		e Entry
		i int
	}
	win := map[Key]claim{}
	wantedOwner := map[uint64]int{}
	for i, p := range want {
		wantedOwner[OwnerID(p.Owner)] = i
		for _, e := range Entries(p, netns) {
			if c, ok := win[e.Key]; !ok || e.Value.Rank >= c.e.Value.Rank {
				win[e.Key] = claim{e, i}
			}
		}
	}
	d := entryDiff{whys: make([]string, len(want))}
	what := map[int][]string{}
	keys := make([]Key, 0, len(win))
	for k := range win {
		keys = append(keys, k)
	}
	sortKeys(keys)
	for _, k := range keys {
		c := win[k]
		cur, ok := s.Entries[k]
		switch {
		case ok && cur == c.e.Value:
			continue
		case !ok:
			what[c.i] = append(what[c.i], "entry "+k.String()+" missing")
		default:
			what[c.i] = append(what[c.i], "entry "+k.String()+" went to "+cur.Target())
		}
		d.put = append(d.put, c.e)
	}
	for k, v := range s.Entries {
		if _, wins := win[k]; wins || k.Family() != f {
			continue
		}
		if i, ok := wantedOwner[v.Owner]; ok {
			d.stale = append(d.stale, k)
			what[i] = append(what[i], "stale entry "+k.String())
			continue
		}
		d.orphans = append(d.orphans, k)
	}
	sortKeys(d.stale)
	sortKeys(d.orphans)
	for i, ws := range what {
		slices.Sort(ws)
		d.whys[i] = strings.Join(ws, ", ")
	}
	return d
}

// ownerEntries adds to w the owner entries its entries leave: an owner entry
// for each wanted owner that holds an entry after w and has none (or
// another), and none for an owner that holds no entry after w — a
// wanted owner's, or with prune any owner's.
func ownerEntries(s *State, want []*plan.Plan, w *Write, prune bool) {
	after := holders(s, w)
	wanted := map[uint64]bool{}
	for _, p := range want {
		id := OwnerID(p.Owner)
		wanted[id] = true
		if rec, ok := s.Owners[id]; (!ok || rec != p.Owner) && after[id] {
			if w.PutOwners == nil {
				w.PutOwners = map[uint64]plan.Owner{}
			}
			w.PutOwners[id] = p.Owner
		}
	}
	// an owner entry goes with its owner's last entry in the namespace
	for id := range s.Owners {
		if !after[id] && (wanted[id] || prune) {
			w.DelOwners = append(w.DelOwners, id)
		}
	}
	sort.Slice(w.DelOwners, func(i, j int) bool { return w.DelOwners[i] < w.DelOwners[j] })
}

// holders are the owners that hold an entry after w (its puts and
// deletes never name one key twice).
func holders(s *State, w *Write) map[uint64]bool {
	final := make(map[Key]uint64, len(s.Entries))
	for k, v := range s.Entries {
		final[k] = v.Owner
	}
	for _, k := range w.Delete {
		delete(final, k)
	}
	for _, e := range w.Put {
		final[e.Key] = e.Value.Owner
	}
	out := map[uint64]bool{}
	for _, id := range final {
		out[id] = true
	}
	return out
}

func compareKeys(a, b Key) int {
	return cmp.Or(bytes.Compare(a.Addr[:], b.Addr[:]), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
}

// installed reads s back as `portmap-agent list` shows it: a wildcard
// mapping's entry has no host IP.
func installed(s *State, f plan.Family) []plan.Installed {
	var out []plan.Installed
	for k, v := range s.Entries {
		if k.Family() != f {
			continue
		}
		in := plan.Installed{HostPort: int(k.Port), Protocol: k.Protocol,
			ContainerIP: net.IP(v.Addr[:]), ContainerPort: int(v.Port),
			Owner: plan.Owner{Network: plan.Unknown, ContainerID: plan.Unknown}}
		if v.Rank == RankExact {
			in.HostIP = net.IP(k.Addr[:])
		}
		if f == plan.IPv4 {
			in.ContainerIP = in.ContainerIP.To4()
			if in.HostIP != nil {
				in.HostIP = in.HostIP.To4()
			}
		}
		if o, ok := s.Owners[v.Owner]; ok {
			in.Owner = plan.Owner{Network: o.Network, ContainerID: o.ContainerID}
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.HostPort, b.HostPort), bytes.Compare(a.HostIP, b.HostIP)) < 0
	})
	return out
}

// sortKeys orders keys by compareKeys. (sort, not slices: a generic sort
// is a copy of the algorithm per element type in the plugin's binary.)
func sortKeys(keys []Key) {
	sort.Slice(keys, func(i, j int) bool { return compareKeys(keys[i], keys[j]) < 0 })
}
