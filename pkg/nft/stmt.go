package nft

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// A Stmt is one match or statement of a rule. It is spelled twice from
// the same value: as nft syntax (golden files, nft when a rule holds
// conditions) and as the kernel's expressions (what netlink sends), which
// is what nft would compile the text to.
type Stmt interface {
	Text(f Family) string
	Encode(e *Exprs)
}

// L4Proto: meta l4proto tcp
type L4Proto struct{ Name string }

func (s L4Proto) Text(Family) string { return "meta l4proto " + s.Name }
func (s L4Proto) Encode(e *Exprs) {
	e.Meta(unix.NFT_META_L4PROTO, Reg1)
	e.Cmp(unix.NFT_CMP_EQ, Reg1, []byte{ProtoNum(s.Name)})
}

// DPort: th dport 8080, th dport 20000-20999 (the transport header's
// destination port, which TCP, UDP and SCTP keep at the same place)
type DPort struct{ Port, Last int }

func (s DPort) Text(Family) string {
	if s.Last > s.Port {
		return "th dport " + strconv.Itoa(s.Port) + "-" + strconv.Itoa(s.Last)
	}
	return "th dport " + strconv.Itoa(s.Port)
}

func (s DPort) Encode(e *Exprs) {
	be16 := func(v int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(v)) }
	e.Payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, Reg1)
	if s.Last > s.Port {
		e.Cmp(unix.NFT_CMP_GTE, Reg1, be16(s.Port))
		e.Cmp(unix.NFT_CMP_LTE, Reg1, be16(s.Last))
		return
	}
	e.Cmp(unix.NFT_CMP_EQ, Reg1, be16(s.Port))
}

// Addr: ip daddr 198.51.100.1, ip saddr 192.0.2.0/24 — spelled as given,
// matched as a prefix the way nft compiles one: a shorter load for a
// whole number of bytes, a mask otherwise.
type Addr struct {
	Dst  bool
	Spec string // an address or a CIDR
}

func (s Addr) Text(f Family) string {
	dir := "saddr"
	if s.Dst {
		dir = "daddr"
	}
	return f.String() + " " + dir + " " + s.Spec
}

func (s Addr) Encode(e *Exprs) {
	n := ParsePrefix(s.Spec)
	offset, length := e.Family.AddrOffset(s.Dst)
	ones, _ := n.Mask.Size()
	ip := n.IP.Mask(n.Mask)
	if e.Family == IPv4 {
		ip = ip.To4()
	} else {
		ip = ip.To16()
	}
	if ones%8 == 0 && ones > 0 {
		e.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, offset, uint32(ones/8), Reg1)
		e.Cmp(unix.NFT_CMP_EQ, Reg1, ip[:ones/8])
		return
	}
	e.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, offset, length, Reg1)
	e.Bitwise(Reg1, []byte(n.Mask), make([]byte, length))
	e.Cmp(unix.NFT_CMP_EQ, Reg1, ip)
}

// ParsePrefix reads an address (a full-length prefix) or a CIDR; an
// unreadable one is 0.0.0.0/32.
func ParsePrefix(spec string) *net.IPNet {
	if _, n, err := net.ParseCIDR(spec); err == nil {
		return n
	}
	ip := net.ParseIP(spec)
	if ip == nil {
		return &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(32, 32)}
	}
	if v4 := ip.To4(); v4 != nil {
		return &net.IPNet{IP: v4, Mask: net.CIDRMask(32, 32)}
	}
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(128, 128)}
}

// Jump: jump mark-bit13
type Jump struct{ To string }

func (s Jump) Text(Family) string { return "jump " + s.To }
func (s Jump) Encode(e *Exprs)    { e.Verdict(unix.NFT_JUMP, s.To) }

// DNAT: dnat to 192.0.2.2:80, or with port 0 dnat to 192.0.2.2 (the port
// stays). Comparable: a rule read back holds one.
type DNAT struct{ To netip.AddrPort }

// DNATTo is the DNAT to ip and port (0: the port stays).
func DNATTo(ip net.IP, port int) DNAT {
	a, _ := netip.AddrFromSlice(ip)
	return DNAT{To: netip.AddrPortFrom(a.Unmap(), uint16(port))}
}

func (s DNAT) Text(Family) string {
	if s.To.Port() == 0 {
		return "dnat to " + s.To.Addr().String()
	}
	return "dnat to " + s.To.String()
}

func (s DNAT) Encode(e *Exprs) {
	ip, fam := s.To.Addr().Unmap().AsSlice(), uint32(unix.NFPROTO_IPV4)
	if e.Family == IPv6 {
		a := s.To.Addr().As16()
		ip, fam = a[:], unix.NFPROTO_IPV6
	}
	e.Add("immediate", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_IMMEDIATE_DREG, Reg1)
		Value(a, unix.NFTA_IMMEDIATE_DATA, ip)
	})
	if s.To.Port() != 0 {
		e.Add("immediate", func(a *nfnl.Attrs) {
			a.U32(unix.NFTA_IMMEDIATE_DREG, Reg2)
			Value(a, unix.NFTA_IMMEDIATE_DATA, binary.BigEndian.AppendUint16(nil, s.To.Port()))
		})
	}
	e.Add("nat", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT)
		a.U32(unix.NFTA_NAT_FAMILY, fam)
		a.U32(unix.NFTA_NAT_REG_ADDR_MIN, Reg1)
		if s.To.Port() != 0 {
			a.U32(unix.NFTA_NAT_REG_PROTO_MIN, Reg2)
			a.U32(unix.NFTA_NAT_FLAGS, natRangeProtoSpecified)
		}
	})
}

// natRangeProtoSpecified is NF_NAT_RANGE_PROTO_SPECIFIED: a DNAT that
// sets the port too.
const natRangeProtoSpecified = 0x2

// FibLocal: fib daddr type local
type FibLocal struct{}

func (FibLocal) Text(Family) string { return "fib daddr type local" }
func (FibLocal) Encode(e *Exprs) {
	e.Add("fib", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_FIB_DREG, Reg1)
		a.U32(unix.NFTA_FIB_RESULT, unix.NFT_FIB_RESULT_ADDRTYPE)
		a.U32(unix.NFTA_FIB_FLAGS, unix.NFTA_FIB_F_DADDR)
	})
	e.Cmp(unix.NFT_CMP_EQ, Reg1, NE32(unix.RTN_LOCAL))
}

// MarkOr: meta mark set meta mark | 0x2000
type MarkOr struct{ Mark uint32 }

func (s MarkOr) Text(Family) string { return fmt.Sprintf("meta mark set meta mark | %#x", s.Mark) }
func (s MarkOr) Encode(e *Exprs) {
	e.Meta(unix.NFT_META_MARK, Reg1)
	e.Bitwise(Reg1, NE32(^s.Mark), NE32(s.Mark))
	e.Add("meta", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_META_KEY, unix.NFT_META_MARK)
		a.U32(unix.NFTA_META_SREG, Reg1)
	})
}

// MarkHas: meta mark & 0x2000 == 0x2000
type MarkHas struct{ Mark uint32 }

func (s MarkHas) Text(Family) string {
	return fmt.Sprintf("meta mark & %#x == %#x", s.Mark, s.Mark)
}
func (s MarkHas) Encode(e *Exprs) {
	e.Meta(unix.NFT_META_MARK, Reg1)
	e.Bitwise(Reg1, NE32(s.Mark), NE32(0))
	e.Cmp(unix.NFT_CMP_EQ, Reg1, NE32(s.Mark))
}

// Masquerade: masquerade
type Masquerade struct{}

func (Masquerade) Text(Family) string { return "masquerade" }
func (Masquerade) Encode(e *Exprs)    { e.Add("masq", func(*nfnl.Attrs) {}) }

// Drop: drop
type Drop struct{}

func (Drop) Text(Family) string { return "drop" }
func (Drop) Encode(e *Exprs)    { e.Verdict(nfDrop, "") }

// nfDrop is NF_DROP, a verdict code.
const nfDrop = 0

// Lookup: the lookup of what the expressions before it loaded, from
// NFT_REG_1 on, in Set (an anonymous one also by its ID): for a verdict
// (vmap @set), for data a statement after it reads from NFT_REG_1 on
// (map @set: a DNAT through a map), or for membership (@set; Inv: not
// in it, != @set). A rule read back holds one for each lookup, without
// its ID.
type Lookup struct {
	Set                string
	ID                 uint32
	Verdict, Data, Inv bool
}

func (s Lookup) Text(Family) string {
	switch {
	case s.Verdict:
		return "vmap @" + s.Set
	case s.Data:
		return "map @" + s.Set
	case s.Inv:
		return "!= @" + s.Set
	}
	return "@" + s.Set
}

func (s Lookup) Encode(e *Exprs) {
	e.Add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, s.Set)
		a.U32(unix.NFTA_LOOKUP_SREG, Reg1)
		switch {
		case s.Verdict:
			a.U32(unix.NFTA_LOOKUP_DREG, RegVerdict)
		case s.Data:
			a.U32(unix.NFTA_LOOKUP_DREG, Reg1)
		}
		if s.ID != 0 {
			a.U32(unix.NFTA_LOOKUP_SET_ID, s.ID)
		}
		if s.Inv {
			a.U32(unix.NFTA_LOOKUP_FLAGS, unix.NFT_LOOKUP_F_INV)
		}
	})
}

// Conditions are match text in nft syntax that only nft compiles: a
// transaction holding them goes to nft (NeedsNft), and Encode leaves
// them out.
type Conditions struct{ Nft string }

func (s Conditions) Text(Family) string { return s.Nft }
func (s Conditions) Encode(e *Exprs)    { e.raw = true }

// NE32 is v in host order, as meta and ct keep their values.
func NE32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
