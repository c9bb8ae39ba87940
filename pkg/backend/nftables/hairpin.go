package nftables

// Hairpin sets (flat.go): their elements, the dispatch chain's lookup of
// them, and reading them back.

import (
	"cmp"
	"net"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Hairpin is one element of a hairpin set: connections from Src (a
// prefix) to Key are marked for masquerading; Chain owns it.
type Hairpin struct {
	Src   string // a CIDR, "192.0.2.0/24", "127.0.0.1/32"
	Key   Key    // a flat key
	Chain string
}

// set is the hairpin set h lives in.
func (h Hairpin) set() string {
	ones, _ := nft.ParsePrefix(h.Src).Mask.Size()
	return hairpinSet(h.Key.HostIP.IsValid(), ones)
}

// String names the element: its set, source and key.
func (h Hairpin) String() string { return h.set() + " " + h.Src + " . " + h.Key.String() }

// hairpinID is a hairpin element's identity, whoever owns it: its source
// and key (which name its set).
type hairpinID struct {
	src string
	key Key
}

func (h Hairpin) id() hairpinID { return hairpinID{h.Src, h.Key} }

// compareHairpins orders hairpin elements by source, then key.
func compareHairpins(a, b Hairpin) int {
	return cmp.Or(strings.Compare(a.Src, b.Src), compareKeys(a.Key, b.Key))
}

// hairpinObj is one hairpin element; deleting needs no chain.
type hairpinObj struct{ h Hairpin }

// element is the hairpin element: its source's network and its key,
// commented with its owner.
func (v hairpinObj) element(f nft.Family) *nft.Element {
	n := nft.ParsePrefix(v.h.Src)
	key := n.IP.Mask(n.Mask).To16()
	if f == nft.IPv4 {
		key = key.To4()
	}
	addr, ones, _ := hairpinLength(v.h.set())
	return &nft.Element{Set: hairpinSetOf(f, addr, ones), Key: v.h.Key.appendBytes(append([]byte(nil), key...)), Comment: v.h.Chain}
}

func (v hairpinObj) Text(tx *nft.Tx, vb nft.Verb, b *strings.Builder) {
	v.element(tx.Family).Text(tx, vb, b)
}

func (v hairpinObj) Encode(tx *nft.Tx, vb nft.Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	return v.element(tx.Family).Encode(tx, vb, m, a)
}

// hairpinLookup: ip saddr & 255.255.255.0 . [ip daddr .] meta l4proto .
// th dport @hairpin_24 — a connection from a source its hairpin set of
// that prefix length holds for its key.
type hairpinLookup struct {
	addr bool
	ones int
}

func (s hairpinLookup) set() string { return hairpinSet(s.addr, s.ones) }

// mask is the source's mask, nil for a full-length prefix.
func (s hairpinLookup) mask(f nft.Family) net.IPMask {
	bits := 8 * int(f.AddrType().Len)
	if s.ones >= bits {
		return nil
	}
	return net.CIDRMask(s.ones, bits)
}

func (s hairpinLookup) Text(f nft.Family) string {
	t := f.String() + " saddr "
	if m := s.mask(f); m != nil {
		t += "& " + net.IP(m).String() + " "
	}
	t += ". "
	if s.addr {
		t += f.String() + " daddr . "
	}
	return t + "meta l4proto . th dport @" + s.set()
}

func (s hairpinLookup) Encode(e *nft.Exprs) {
	soff, length := e.Family.AddrOffset(false)
	e.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, soff, length, nft.Reg1)
	if m := s.mask(e.Family); m != nil {
		e.Bitwise(nft.Reg1, []byte(m), make([]byte, length))
	}
	next := uint32(nft.Reg32) + length/4
	if s.addr {
		doff, _ := e.Family.AddrOffset(true)
		e.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, doff, length, next)
		next += length / 4
	}
	e.Meta(unix.NFT_META_L4PROTO, next)
	e.Payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, next+1)
	nft.Lookup{Set: s.set()}.Encode(e)
}

// decodeHairpins reads the elements of a hairpin set's GETSETELEM answer.
func decodeHairpins(f plan.Family, b []byte) []Hairpin {
	ipLen := int(nft.Family(f).AddrType().Len)
	var out []Hairpin
	for _, e := range nft.DecodeElements(b) {
		addr, ones, ok := hairpinLength(e.Set.Name)
		if !ok || len(e.Key) < ipLen {
			continue
		}
		keySet := hostPortsMap
		if addr {
			keySet = hostIPPortsMap
		}
		if k, ok := keyFromBytes(f, keySet, e.Key[ipLen:]); ok {
			k.Flat = true
			out = append(out, Hairpin{Src: prefixString(net.IP(e.Key[:ipLen]), ones, ipLen*8), Key: k, Chain: e.Comment})
		}
	}
	return out
}
