package nftables

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// The layout's own statements beside pkg/nft's: its map lookups and the
// guard's drop, as nft syntax and as expressions.

// vmapLookup: [ip daddr .] meta l4proto . th dport vmap @map — the
// dispatch of a packet to the chain of the attachment that owns its key.
type vmapLookup struct {
	set      string
	addr     bool
	interval bool // the map's keys are intervals of ports
}

func (s vmapLookup) Text(f nft.Family) string {
	t := "meta l4proto . th dport vmap @" + s.set
	if s.addr {
		t = f.String() + " daddr . " + t
	}
	return t
}

func (s vmapLookup) Encode(e *nft.Exprs) {
	next := uint32(nft.Reg32)
	if s.addr {
		offset, length := e.Family.AddrOffset(true)
		e.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, offset, length, nft.Reg1)
		next += length / 4
	}
	protoReg := next
	if !s.addr {
		protoReg = nft.Reg1
	}
	// nft before 1.1 turned the protocol of a concatenation of ranges to
	// network order with a byteorder of one byte in two (it moves
	// nothing); Debian 13's kernel (6.12.118) refuses that rule with
	// EOPNOTSUPP, and nft 1.1 writes none: neither does this
	e.Meta(unix.NFT_META_L4PROTO, protoReg)
	e.Payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, next+1)
	nft.Lookup{Set: s.set, Verdict: true}.Encode(e)
}

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

func (guardDrop) Text(nft.Family) string { return guardRule }
func (guardDrop) Encode(e *nft.Exprs) {
	e.Meta(unix.NFT_META_IIFNAME, nft.Reg1)
	lo := make([]byte, 16)
	copy(lo, "lo")
	e.Cmp(unix.NFT_CMP_NEQ, nft.Reg1, lo)
	e.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, 16, 1, nft.Reg1)
	e.Cmp(unix.NFT_CMP_EQ, nft.Reg1, []byte{127})
	e.Add("ct", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_CT_DREG, nft.Reg1)
		a.U32(unix.NFTA_CT_KEY, unix.NFT_CT_STATE)
	})
	set := e.AnonSet(nft.CTState.ID, 4, [][]byte{nft.NE32(ctEstablished), nft.NE32(ctRelated)})
	nft.Lookup{Set: set.Name, ID: set.ID, Inv: true}.Encode(e)
	e.Add("ct", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_CT_DREG, nft.Reg1)
		a.U32(unix.NFTA_CT_KEY, unix.NFT_CT_STATUS)
	})
	e.Bitwise(nft.Reg1, nft.NE32(ctStatusDNAT), nft.NE32(0))
	e.Cmp(unix.NFT_CMP_EQ, nft.Reg1, nft.NE32(0))
	nft.Drop{}.Encode(e)
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

func (s dnatMap) Text(f nft.Family) string {
	var b strings.Builder
	b.Grow(16 + 40*len(s.entries))
	b.WriteString("dnat " + f.String() + " to ")
	if s.addr {
		b.WriteString(f.String() + " daddr . ")
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

func (s dnatMap) Encode(e *nft.Exprs) {
	key := keyTypes(e.Family, s.addr)
	keyType, keyLen := nft.ConcatType(key...), nft.ConcatLen(key...)
	ip, ipLen := s.to.To4(), uint32(4)
	if e.Family == nft.IPv6 {
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
	to := []nft.Type{e.Family.AddrType(), nft.InetService}
	set := e.AnonMap(keyType, keyLen, nft.ConcatType(to...), nft.ConcatLen(to...), keys, data)
	dnatByMap(e, s.addr, set.Name, set.ID)
}

const guardRule = `iifname != "lo" ip daddr 127.0.0.0/8 ct state != { established, related } ct status & dnat == 0 drop`
