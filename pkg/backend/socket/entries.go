package socket

import (
	"bytes"
	"cmp"
	"slices"
	"strings"

	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"

	"github.com/portmap-dev/portmap/pkg/converge"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// The layout of the maps' keys and values. The programs read the fields
// marked (bpf); the rest is for this package alone. Integers the programs
// read are in the host's byte order (little-endian on every architecture
// this package builds for), ports in network order as the kernel's
// bpf_sock_addr keeps them: the two bytes of the port, then two zeros.
const (
	keySize    = 32 // netns cookie u64 (bpf) | address [16] (bpf) | port u32 (bpf) | protocol u32 (bpf)
	valueSize  = 40 // address [16] (bpf) | port u32 (bpf) | rank u32 | owner u64 | network u64
	revKeySize = 32 // socket cookie u64 | address [16] | port u32 | zero u32
	revValSize = 24 // address [16] | port u32 | zero u32
	ownerSize  = 256
	ownerKey   = 24 // netns cookie u64 | family u32 | zero u32 | owner u64
)

// Rank orders entries that want one key: a mapping with this exact host
// IP beats a wildcard mapping's loopback entry, as the NAT path's exact
// host-IP lookup comes before the wildcard one; within a rank the newest
// ADD wins.
type Rank uint32

const (
	RankWildcard Rank = 1 // a mapping without host IP, at 127.0.0.1 or ::1
	RankExact    Rank = 2 // a mapping whose host IP is this address
)

// Key is a destination the programs rewrite: in the network namespace
// whose cookie is Netns, Addr:Port over Protocol. Addr is 16 bytes, IPv4
// as ::ffff:a.b.c.d, so that an IPv6 socket dialling a v4-mapped address
// meets the IPv4 entry.
type Key struct {
	Netns    uint64
	Addr     [16]byte
	Port     uint16
	Protocol plan.Protocol
}

// Value is where a key's connections go, and who put it there.
type Value struct {
	Addr    [16]byte
	Port    uint16
	Rank    Rank
	Owner   uint64 // OwnerID of the attachment
	Network uint64 // NetworkID of its network
}

type (
	rawKey    [keySize]byte
	rawValue  [valueSize]byte
	rawOwner  [ownerSize]byte
	rawOwnKey [ownerKey]byte
	rawRevKey [revKeySize]byte
	rawRevVal [revValSize]byte
)

var protoNumbers = map[plan.Protocol]uint32{plan.TCP: 6, plan.UDP: 17}

func protoOf(n uint32) plan.Protocol {
	for p, v := range protoNumbers {
		if v == n {
			return p
		}
	}
	return plan.Protocol(strconv.Itoa(int(n)))
}

func putPort(b []byte, port uint16) { binary.BigEndian.PutUint16(b, port) }

func (k Key) raw() rawKey {
	var r rawKey
	binary.LittleEndian.PutUint64(r[0:], k.Netns)
	copy(r[8:24], k.Addr[:])
	putPort(r[24:], k.Port)
	binary.LittleEndian.PutUint32(r[28:], protoNumbers[k.Protocol])
	return r
}

func (r rawKey) key() Key {
	k := Key{Netns: binary.LittleEndian.Uint64(r[0:]), Port: binary.BigEndian.Uint16(r[24:]),
		Protocol: protoOf(binary.LittleEndian.Uint32(r[28:]))}
	copy(k.Addr[:], r[8:24])
	return k
}

func (v Value) raw() rawValue {
	var r rawValue
	copy(r[0:16], v.Addr[:])
	putPort(r[16:], v.Port)
	binary.LittleEndian.PutUint32(r[20:], uint32(v.Rank))
	binary.LittleEndian.PutUint64(r[24:], v.Owner)
	binary.LittleEndian.PutUint64(r[32:], v.Network)
	return r
}

func (r rawValue) value() Value {
	v := Value{Port: binary.BigEndian.Uint16(r[16:]), Rank: Rank(binary.LittleEndian.Uint32(r[20:])),
		Owner: binary.LittleEndian.Uint64(r[24:]), Network: binary.LittleEndian.Uint64(r[32:])}
	copy(v.Addr[:], r[0:16])
	return v
}

// Family is the family of the key's address.
func (k Key) Family() plan.Family { return familyOf(k.Addr) }

func familyOf(a [16]byte) plan.Family { return plan.FamilyOf(net.IP(a[:])) }

func (k Key) String() string {
	return net.JoinHostPort(net.IP(k.Addr[:]).String(), strconv.Itoa(int(k.Port))) + "/" + string(k.Protocol)
}

// Target is "192.0.2.2:80" or "[2001:db8::2]:80".
func (v Value) Target() string {
	return net.JoinHostPort(net.IP(v.Addr[:]).String(), strconv.Itoa(int(v.Port)))
}

func addr16(ip net.IP) (a [16]byte) {
	copy(a[:], ip.To16())
	return a
}

// Loopback addresses a wildcard mapping is served at. Only 127.0.0.1 of
// 127.0.0.0/8: a host port 53 must not take the node's stub resolver at
// 127.0.0.53 (cilium#24818); a mapping with hostIP 127.0.0.53 asks for
// that address by name.
var loopback = map[plan.Family]net.IP{plan.IPv4: net.IPv4(127, 0, 0, 1), plan.IPv6: net.IPv6loopback}

// OwnerID is the owner's 64-bit name in the maps (FNV-1a of its three
// parts); the owners map keeps the names it stands for.
func OwnerID(o plan.Owner) uint64 {
	h := fnv.New64a()
	for _, s := range []string{o.Network, o.ContainerID, o.IfName} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// NetworkID is a network's 64-bit name in the maps, for GC.
func NetworkID(network string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(network))
	return h.Sum64()
}

// Entry is one key and its value.
type Entry struct {
	Key   Key
	Value Value
}

// Served reports whether m has socket entries: TCP and UDP. SCTP keeps
// the DNAT path only (its host ports are not served at loopback by this
// path).
func Served(m plan.Mapping) bool { _, ok := protoNumbers[m.Protocol]; return ok }

// Entries are the keys p's attachment wants in the namespace whose
// cookie is netns, with their values; the values' addresses are zero
// when p has no container address (DEL without prevResult). A key
// wanted twice keeps its first mapping, as the first DNAT rule wins.
func Entries(p *plan.Plan, netns uint64) []Entry {
	owner, network := OwnerID(p.Owner), NetworkID(p.Owner.Network)
	var caddr [16]byte
	if p.ContainerNet != nil {
		caddr = addr16(p.ContainerNet.IP)
	}
	out := make([]Entry, 0, len(p.Mappings))
	seen := make(map[Key]bool, len(p.Mappings))
	for _, m := range p.Mappings {
		if !Served(m) {
			continue
		}
		k := Key{Netns: netns, Port: uint16(m.HostPort), Protocol: m.Protocol}
		rank := RankWildcard
		if m.HostIP != nil {
			k.Addr, rank = addr16(m.HostIP), RankExact
		} else {
			k.Addr = addr16(loopback[p.Family])
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, Entry{k, Value{Addr: caddr, Port: uint16(m.ContainerPort), Rank: rank, Owner: owner, Network: network}})
	}
	return out
}

// ownerRecord encodes o for the owners map: the lengths of the network,
// the container ID and the interface, then the three, cut to fit (the ID
// in the entries stays exact; the record is for reports).
func ownerRecord(o plan.Owner) rawOwner {
	var r rawOwner
	b := r[4:4]
	for i, s := range []string{o.Network, o.ContainerID, o.IfName} {
		n := min(len(s), cap(b)-len(b), 255)
		r[i] = byte(n)
		b = append(b, s[:n]...)
	}
	return r
}

func (r rawOwner) owner() plan.Owner {
	parts := make([]string, 3)
	off := 4
	for i := range parts {
		n := int(r[i])
		if off+n > len(r) {
			return plan.Owner{Network: plan.Unknown, ContainerID: plan.Unknown}
		}
		parts[i] = string(r[off : off+n])
		off += n
	}
	return plan.Owner{Network: parts[0], ContainerID: parts[1], IfName: parts[2]}
}

func ownerKeyOf(netns uint64, f plan.Family, id uint64) rawOwnKey {
	var r rawOwnKey
	binary.LittleEndian.PutUint64(r[0:], netns)
	binary.LittleEndian.PutUint32(r[8:], uint32(f))
	binary.LittleEndian.PutUint64(r[16:], id)
	return r
}

func (r rawOwnKey) parts() (netns uint64, f plan.Family, id uint64) {
	return binary.LittleEndian.Uint64(r[0:]), plan.Family(binary.LittleEndian.Uint32(r[8:])), binary.LittleEndian.Uint64(r[16:])
}

// State is what one site holds of one namespace and family: its entries
// and its owner records (each family keeps its own, so the two families'
// passes never race on one record).
type State struct {
	Entries map[Key]Value
	Owners  map[uint64]plan.Owner
}

// Write is what one call changes: entries put and deleted, owner
// records put and deleted.
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

// ownersEmptied lists the owner records whose every entry is in gone
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

// syncWrite is a `portmap sync` pass over family f: every key goes to
// the wanted plan (oldest first) that wins it — the highest rank, then
// the newest — entries of wanted owners that no longer win a key go, and
// entries of owners no plan wants are orphans, pruned with o.Prune. Keys
// that are right are not written, so a pass after a pass writes nothing.
func syncWrite(s *State, want []*plan.Plan, netns uint64, f plan.Family, o converge.Options) (*Write, *converge.Report, map[int]bool) {
	rep := converge.NewReport(len(want))
	w := &Write{}
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
	broken := map[int]bool{}
	what := map[int][]string{}
	keys := make([]Key, 0, len(win))
	for k := range win {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	for _, k := range keys {
		c := win[k]
		cur, ok := s.Entries[k]
		if ok && cur == c.e.Value {
			continue
		}
		w.Put = append(w.Put, c.e)
		broken[c.i] = true
		if !ok {
			what[c.i] = append(what[c.i], "entry "+k.String()+" missing")
		} else {
			what[c.i] = append(what[c.i], "entry "+k.String()+" went to "+cur.Target())
		}
	}
	var orphans []Key
	for k, v := range s.Entries {
		if k.Family() != f {
			continue
		}
		if _, wins := win[k]; wins {
			continue
		}
		if i, ok := wantedOwner[v.Owner]; ok {
			w.Delete = append(w.Delete, k)
			broken[i] = true
			what[i] = append(what[i], "stale entry "+k.String())
			continue
		}
		orphans = append(orphans, k)
	}
	slices.SortFunc(orphans, compareKeys)
	for _, k := range orphans {
		v := s.Entries[k]
		own, known := s.Owners[v.Owner]
		if !known {
			own = plan.Owner{}
		}
		if rep.AddOrphan(o, own.Network, own.ContainerID, "socket entry "+k.String()) && o.Prune {
			w.Delete = append(w.Delete, k)
		}
	}
	for i := range want {
		if broken[i] {
			slices.Sort(what[i])
			rep.Results[i] = converge.Result{State: converge.Repaired, What: strings.Join(what[i], ", ")}
		}
	}
	after := holders(s, w)
	for _, p := range want {
		id := OwnerID(p.Owner)
		if rec, ok := s.Owners[id]; (!ok || rec != p.Owner) && after[id] {
			if w.PutOwners == nil {
				w.PutOwners = map[uint64]plan.Owner{}
			}
			w.PutOwners[id] = p.Owner
		}
	}
	// a record goes with its owner's last entry in the namespace
	for id := range s.Owners {
		if _, wanted := wantedOwner[id]; !after[id] && (wanted || o.Prune) {
			w.DelOwners = append(w.DelOwners, id)
		}
	}
	slices.Sort(w.DelOwners)
	return w, rep, broken
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

// installed reads s back as `portmap list` shows it: a wildcard
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
	slices.SortFunc(out, func(a, b plan.Installed) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.HostPort, b.HostPort), bytes.Compare(a.HostIP, b.HostIP))
	})
	return out
}
