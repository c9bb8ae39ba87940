package nftables

import (
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// A stmt is one match or statement of a rule we write. It is spelled
// twice from the same value: as nft syntax (the golden files, nft when a
// rule holds conditions) and as the kernel's expressions (what netlink
// sends), which is what nft would compile the text to.
type stmt interface {
	text(f plan.Family) string
	encode(e *exprs)
}

// protoIs: meta l4proto tcp
type protoIs struct{ p plan.Protocol }

func (s protoIs) text(plan.Family) string { return "meta l4proto " + string(s.p) }
func (s protoIs) encode(e *exprs) {
	e.meta(unix.NFT_META_L4PROTO, reg1)
	e.cmp(unix.NFT_CMP_EQ, reg1, []byte{protoNum(s.p)})
}

// dportIs: th dport 8080, th dport 20000-20999 (the transport header's
// destination port, which TCP, UDP and SCTP keep at the same place)
type dportIs struct{ port, last int }

func (s dportIs) text(plan.Family) string {
	if s.last > s.port {
		return "th dport " + strconv.Itoa(s.port) + "-" + strconv.Itoa(s.last)
	}
	return "th dport " + strconv.Itoa(s.port)
}

func (s dportIs) encode(e *exprs) {
	be16 := func(v int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(v)) }
	e.payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, reg1)
	if s.last > s.port {
		e.cmp(unix.NFT_CMP_GTE, reg1, be16(s.port))
		e.cmp(unix.NFT_CMP_LTE, reg1, be16(s.last))
		return
	}
	e.cmp(unix.NFT_CMP_EQ, reg1, be16(s.port))
}

// addrIs: ip daddr 198.51.100.1, ip saddr 192.0.2.0/24 — spelled as
// given, matched as a prefix the way nft compiles one: a shorter load for
// a whole number of bytes, a mask otherwise.
type addrIs struct {
	dst  bool
	spec string // an address or a CIDR
}

func (s addrIs) text(f plan.Family) string {
	dir := "saddr"
	if s.dst {
		dir = "daddr"
	}
	return ipX(f) + " " + dir + " " + s.spec
}

func (s addrIs) encode(e *exprs) {
	n := parsePrefix(s.spec)
	offset, length := addrOffset(e.fam, s.dst)
	ones, _ := n.Mask.Size()
	ip := n.IP.Mask(n.Mask)
	if e.fam == plan.IPv4 {
		ip = ip.To4()
	} else {
		ip = ip.To16()
	}
	if ones%8 == 0 && ones > 0 {
		e.payload(unix.NFT_PAYLOAD_NETWORK_HEADER, offset, uint32(ones/8), reg1)
		e.cmp(unix.NFT_CMP_EQ, reg1, ip[:ones/8])
		return
	}
	e.payload(unix.NFT_PAYLOAD_NETWORK_HEADER, offset, length, reg1)
	e.bitwise(reg1, []byte(n.Mask), make([]byte, length))
	e.cmp(unix.NFT_CMP_EQ, reg1, ip)
}

// parsePrefix reads an address (a full-length prefix) or a CIDR.
func parsePrefix(spec string) *net.IPNet {
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

// jumpTo: jump mark-bit13
type jumpTo struct{ chain string }

func (s jumpTo) text(plan.Family) string { return "jump " + s.chain }
func (s jumpTo) encode(e *exprs)         { e.verdict(unix.NFT_JUMP, s.chain) }

// dnatTo: dnat to 192.0.2.2:80, or with port 0 dnat to 192.0.2.2 (the
// port stays)
type dnatTo struct {
	ip   net.IP
	port int
}

func (s dnatTo) text(plan.Family) string {
	if s.port == 0 {
		return "dnat to " + s.ip.String()
	}
	return "dnat to " + net.JoinHostPort(s.ip.String(), strconv.Itoa(s.port))
}

func (s dnatTo) encode(e *exprs) {
	ip, fam := s.ip.To4(), uint32(unix.NFPROTO_IPV4)
	if e.fam == plan.IPv6 {
		ip, fam = s.ip.To16(), unix.NFPROTO_IPV6
	}
	e.add("immediate", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_IMMEDIATE_DREG, reg1)
		dataValue(a, unix.NFTA_IMMEDIATE_DATA, ip)
	})
	if s.port != 0 {
		e.add("immediate", func(a *nfnl.Attrs) {
			a.U32(unix.NFTA_IMMEDIATE_DREG, reg2)
			dataValue(a, unix.NFTA_IMMEDIATE_DATA, binary.BigEndian.AppendUint16(nil, uint16(s.port)))
		})
	}
	e.add("nat", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT)
		a.U32(unix.NFTA_NAT_FAMILY, fam)
		a.U32(unix.NFTA_NAT_REG_ADDR_MIN, reg1)
		if s.port != 0 {
			a.U32(unix.NFTA_NAT_REG_PROTO_MIN, reg2)
			a.U32(unix.NFTA_NAT_FLAGS, natRangeProtoSpecified)
		}
	})
}

const (
	natRangeProtoSpecified = 0x2 // NF_NAT_RANGE_PROTO_SPECIFIED
	nfDrop                 = 0   // NF_DROP, a verdict code
)

// fibLocal: fib daddr type local
type fibLocal struct{}

func (fibLocal) text(plan.Family) string { return "fib daddr type local" }
func (fibLocal) encode(e *exprs) {
	e.add("fib", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_FIB_DREG, reg1)
		a.U32(unix.NFTA_FIB_RESULT, unix.NFT_FIB_RESULT_ADDRTYPE)
		a.U32(unix.NFTA_FIB_FLAGS, unix.NFTA_FIB_F_DADDR)
	})
	e.cmp(unix.NFT_CMP_EQ, reg1, ne32(unix.RTN_LOCAL))
}

// vmapLookup: [ip daddr .] meta l4proto . th dport vmap @map — the
// dispatch of a packet to the chain of the attachment that owns its key.
type vmapLookup struct {
	set      string
	addr     bool
	interval bool // the map's keys are intervals of ports
}

func (s vmapLookup) text(f plan.Family) string {
	t := "meta l4proto . th dport vmap @" + s.set
	if s.addr {
		t = ipX(f) + " daddr . " + t
	}
	return t
}

func (s vmapLookup) encode(e *exprs) {
	next := uint32(reg32)
	first := uint32(reg1)
	if s.addr {
		offset, length := addrOffset(e.fam, true)
		e.payload(unix.NFT_PAYLOAD_NETWORK_HEADER, offset, length, reg1)
		next += length / 4
	}
	protoReg := next
	if !s.addr {
		protoReg = reg1
	}
	// nft before 1.1 turned the protocol of a concatenation of ranges to
	// network order with a byteorder of one byte in two (it moves
	// nothing); Debian 13's kernel (6.12.118) refuses that rule with
	// EOPNOTSUPP, and nft 1.1 writes none: neither does this
	e.meta(unix.NFT_META_L4PROTO, protoReg)
	e.payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, next+1)
	e.add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, s.set)
		a.U32(unix.NFTA_LOOKUP_SREG, first)
		a.U32(unix.NFTA_LOOKUP_DREG, regVerdict)
	})
}

// markOr: meta mark set meta mark | 0x2000
type markOr struct{ mark uint32 }

func (s markOr) text(plan.Family) string { return fmt.Sprintf("meta mark set meta mark | %#x", s.mark) }
func (s markOr) encode(e *exprs) {
	e.meta(unix.NFT_META_MARK, reg1)
	e.bitwise(reg1, ne32(^s.mark), ne32(s.mark))
	e.add("meta", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_META_KEY, unix.NFT_META_MARK)
		a.U32(unix.NFTA_META_SREG, reg1)
	})
}

// markHas: meta mark & 0x2000 == 0x2000
type markHas struct{ mark uint32 }

func (s markHas) text(plan.Family) string {
	return fmt.Sprintf("meta mark & %#x == %#x", s.mark, s.mark)
}
func (s markHas) encode(e *exprs) {
	e.meta(unix.NFT_META_MARK, reg1)
	e.bitwise(reg1, ne32(s.mark), ne32(0))
	e.cmp(unix.NFT_CMP_EQ, reg1, ne32(s.mark))
}

// masquerade
type masquerade struct{}

func (masquerade) text(plan.Family) string { return "masquerade" }
func (masquerade) encode(e *exprs)         { e.add("masq", func(*nfnl.Attrs) {}) }

// guardDrop is the guard chain's rule (guardRule): drop connections to
// 127.0.0.0/8 that come from outside and are neither established nor
// DNATed.
type guardDrop struct{}

// ct state bits (NF_CT_STATE_BIT) and the DNAT status bit.
const (
	ctEstablished = 1 << 1
	ctRelated     = 1 << 2
	ctStatusDNAT  = 0x20 // IPS_DST_NAT
)

func (guardDrop) text(plan.Family) string { return guardRule }
func (guardDrop) encode(e *exprs) {
	e.meta(unix.NFT_META_IIFNAME, reg1)
	lo := make([]byte, 16)
	copy(lo, "lo")
	e.cmp(unix.NFT_CMP_NEQ, reg1, lo)
	e.payload(unix.NFT_PAYLOAD_NETWORK_HEADER, 16, 1, reg1)
	e.cmp(unix.NFT_CMP_EQ, reg1, []byte{127})
	e.add("ct", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_CT_DREG, reg1)
		a.U32(unix.NFTA_CT_KEY, unix.NFT_CT_STATE)
	})
	set := e.tx.anonSet(ctStateType, 4, [][]byte{ne32(ctEstablished), ne32(ctRelated)})
	e.add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, set.name)
		a.U32(unix.NFTA_LOOKUP_SREG, reg1)
		a.U32(unix.NFTA_LOOKUP_SET_ID, set.id)
		a.U32(unix.NFTA_LOOKUP_FLAGS, unix.NFT_LOOKUP_F_INV)
	})
	e.add("ct", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_CT_DREG, reg1)
		a.U32(unix.NFTA_CT_KEY, unix.NFT_CT_STATUS)
	})
	e.bitwise(reg1, ne32(ctStatusDNAT), ne32(0))
	e.cmp(unix.NFT_CMP_EQ, reg1, ne32(0))
	e.verdict(nfDrop, "")
}

// conditions are the user's match text (conditionsV4/V6), in nft syntax
// that only nft compiles: a transaction holding them goes to nft.
type conditions struct{ nft string }

func (s conditions) text(plan.Family) string { return s.nft }
func (s conditions) encode(e *exprs)         { e.raw = true }

func ruleText(f plan.Family, stmts []stmt) string {
	parts := make([]string, 0, len(stmts))
	for _, s := range stmts {
		parts = append(parts, s.text(f))
	}
	return strings.Join(parts, " ")
}

// dnatMap: dnat ip to [ip daddr .] meta l4proto . th dport map { tcp .
// 20000 : 192.0.2.2 . 80, … } — the DNAT of many single mappings as one
// rule looking the packet's key up in an anonymous map of the rule's.
// The kernel parses one rule and an element per mapping, not a rule per
// mapping (5000 rules cost it ~75 ms here, a map of 5000 ~7 ms), and a
// connection finds its target in one lookup, not a walk of the chain.
type dnatMap struct {
	addr    bool // keyed by the host address too (hostip_hostports)
	to      net.IP
	entries []mapEntry
}

// mapEntry is one key of a dnatMap and the container port it goes to.
type mapEntry struct {
	key  Key
	port int
}

func (s dnatMap) text(f plan.Family) string {
	var b strings.Builder
	b.Grow(16 + 40*len(s.entries))
	b.WriteString("dnat " + ipX(f) + " to ")
	if s.addr {
		b.WriteString(ipX(f) + " daddr . ")
	}
	b.WriteString("meta l4proto . th dport map { ")
	to := s.to.String()
	for i, m := range s.entries {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(m.key.String())
		b.WriteString(" : " + to + " . ")
		b.WriteString(strconv.Itoa(m.port))
	}
	b.WriteString(" }")
	return b.String()
}

func (s dnatMap) encode(e *exprs) {
	keyLen := uint32(8)
	keyType := concatType(typeInetProto, typeInetService)
	if s.addr {
		_, length := addrOffset(e.fam, true)
		keyLen += length
		keyType = concatType(addrType(e.fam), typeInetProto, typeInetService)
	}
	ip, ipLen := s.to.To4(), uint32(4)
	if e.fam == plan.IPv6 {
		ip, ipLen = s.to.To16(), 16
	}
	keys, data := make([][]byte, len(s.entries)), make([][]byte, len(s.entries))
	// one buffer for every key and target: 5000 mappings are 10,000 values
	buf := make([]byte, 0, len(s.entries)*int(keyLen+ipLen+4))
	for i, m := range s.entries {
		start := len(buf)
		buf = m.key.appendBytes(buf)
		keys[i] = buf[start:len(buf):len(buf)]
		start = len(buf)
		buf = append(buf, ip...)
		buf = append(binary.BigEndian.AppendUint16(buf, uint16(m.port)), 0, 0)
		data[i] = buf[start:len(buf):len(buf)]
	}
	set := e.tx.anonMap(keyType, keyLen, concatType(addrType(e.fam), typeInetService), ipLen+4, keys, data)
	dnatByMap(e, s.addr, set.name, set.id)
}

// addrType is nft's type of the family's addresses.
func addrType(f plan.Family) uint32 {
	if f == plan.IPv6 {
		return typeIPv6Addr
	}
	return typeIPv4Addr
}
