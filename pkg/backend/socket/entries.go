package socket

import (
	"encoding/binary"
	"hash/fnv"
	"net"
	"strconv"

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
// Only loopback is served: a wildcard mapping at 127.0.0.1 and ::1, a
// mapping whose host IP is loopback at that address. A host IP that is
// not loopback — another host's, or one of the node's own — has no
// entry: the DNAT rules judge the node's own connections to it packet by
// packet ("fib daddr type local", "--dst-type LOCAL"), so one to an
// address that leaves the node (a VIP failing over) reaches its new
// owner at once, and one that comes back reaches the container again,
// with nothing for a pass to follow.
func Entries(p *plan.Plan, netns uint64) []Entry {
	owner, network := OwnerID(p.Owner), NetworkID(p.Owner.Network)
	var caddr [16]byte
	if p.ContainerNet != nil {
		caddr = addr16(p.ContainerNet.IP)
	}
	out := make([]Entry, 0, p.Mappings.Len())
	seen := make(map[Key]bool, p.Mappings.Len())
	for m := range p.Mappings.All() {
		if !Served(m) {
			continue
		}
		k := Key{Netns: netns, Port: uint16(m.HostPort), Protocol: m.Protocol}
		rank := RankWildcard
		if m.HostIP != nil {
			if !m.HostIP.IsLoopback() {
				continue
			}
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

// ownerEntry encodes o for the owners map: the lengths of the network,
// the container ID and the interface, then the three, cut to fit (the ID
// in the entries stays exact; the owner entry is for reports).
func ownerEntry(o plan.Owner) rawOwner {
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
