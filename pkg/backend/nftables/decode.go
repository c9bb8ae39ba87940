package nftables

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nft"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

func find(attrs []nfnl.Attr, typ uint16) ([]byte, bool) {
	for _, a := range attrs {
		if a.Type == typ {
			return a.Value, true
		}
	}
	return nil, false
}

func str(attrs []nfnl.Attr, typ uint16) string {
	for _, a := range attrs {
		if a.Type == typ {
			return a.String()
		}
	}
	return ""
}

// decodeElements reads the elements of a GETSETELEM answer.
func decodeElements(f plan.Family, b []byte) []Element {
	attrs := nfnl.Parse(b)
	set := str(attrs, unix.NFTA_SET_ELEM_LIST_SET)
	list, _ := nfnl.Find(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	var out []Element
	for _, le := range nfnl.Parse(list) {
		keyAttr, _ := nfnl.Find(le.Value, unix.NFTA_SET_ELEM_KEY)
		val, _ := nfnl.Find(keyAttr, unix.NFTA_DATA_VALUE)
		k, ok := keyFromBytes(f, set, val)
		if !ok {
			continue
		}
		if endAttr, ok := nfnl.Find(le.Value, nft.AttrSetElemKeyEnd); ok {
			end, _ := nfnl.Find(endAttr, unix.NFTA_DATA_VALUE)
			if e, ok := keyFromBytes(f, set, end); ok && e.Port > k.Port {
				k.Last = e.Port
			}
		}
		if k.Flat {
			ipLen := int(nft.Family(f).AddrType().Len)
			data := attrValue(le.Value, unix.NFTA_SET_ELEM_DATA)
			ud, _ := nfnl.Find(le.Value, nft.AttrSetElemUserdata)
			if len(data) < ipLen+2 {
				continue
			}
			chain, srcs := parseFlatComment(nft.CommentOf(ud))
			out = append(out, Element{Key: k, Chain: chain, To: toString(data[:ipLen], data[ipLen:]), Srcs: srcs})
			continue
		}
		data, _ := nfnl.Find(le.Value, unix.NFTA_SET_ELEM_DATA)
		v, _ := nfnl.Find(data, unix.NFTA_DATA_VERDICT)
		ch, _ := nfnl.Find(v, unix.NFTA_VERDICT_CHAIN)
		chain, _, _ := strings.Cut(string(ch), "\x00")
		out = append(out, Element{Key: k, Chain: chain})
	}
	return out
}

// decodeDNATs reads the elements of a DNAT map (dnatMap) out of a
// GETSETELEM answer, or a NEWSETELEM request: keys of protocol and port,
// with or without a host address before them, by their length.
func decodeDNATs(f plan.Family, b []byte) []MapDNAT {
	ipLen := 4
	if f == plan.IPv6 {
		ipLen = 16
	}
	list, _ := nfnl.Find(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	var out []MapDNAT
	for le := range nfnl.All(list) {
		key, data := attrValue(le.Value, unix.NFTA_SET_ELEM_KEY), attrValue(le.Value, unix.NFTA_SET_ELEM_DATA)
		set := hostPortsMap
		if len(key) == 8+ipLen {
			set = hostIPPortsMap
		}
		k, ok := keyFromBytes(f, set, key)
		if !ok || len(data) < ipLen+2 {
			continue
		}
		port := binary.BigEndian.Uint16(data[ipLen:])
		to := net.JoinHostPort(net.IP(data[:ipLen]).String(), strconv.Itoa(int(port)))
		out = append(out, MapDNAT{Key: k, To: to})
	}
	return out
}

// keyFromBytes reads a key of map set back (Key.bytes): the first port of
// an interval key.
func keyFromBytes(f plan.Family, set string, b []byte) (Key, bool) {
	var k Key
	switch set {
	case hostIPPortsMap, hostIPPortRangesMap, hostIPDNATMap:
		n := 4
		if f == plan.IPv6 {
			n = 16
		}
		if len(b) < n {
			return k, false
		}
		k.HostIP = append(net.IP(nil), b[:n]...)
		b = b[n:]
	case hostPortsMap, hostPortRangesMap, HostDNATMap:
	default:
		return k, false
	}
	k.Flat = isDNATMap(set)
	if len(b) < 6 {
		return k, false
	}
	switch b[0] {
	case unix.IPPROTO_TCP:
		k.Protocol = plan.TCP
	case unix.IPPROTO_UDP:
		k.Protocol = plan.UDP
	case unix.IPPROTO_SCTP:
		k.Protocol = plan.SCTP
	default:
		return k, false
	}
	k.Port = int(binary.BigEndian.Uint16(b[4:6]))
	return k, true
}

// decodeRule reads what RuleState holds out of a rule message.
func decodeRule(f plan.Family, b []byte) RuleState { return decodeAttrs(f, nfnl.Parse(b)) }

// decodeAttrs is decodeRule of a rule's parsed attributes.
func decodeAttrs(f plan.Family, attrs []nfnl.Attr) RuleState {
	var list []byte
	d := ruleDecoder{}
	d.saddrOffset, d.addrLen = nft.Family(f).AddrOffset(false)
	for _, a := range attrs {
		switch a.Type {
		case unix.NFTA_RULE_HANDLE:
			if len(a.Value) == 8 {
				d.r.Handle = binary.BigEndian.Uint64(a.Value)
			}
		case unix.NFTA_RULE_USERDATA:
			d.r.Comment = nft.CommentOf(a.Value)
		case unix.NFTA_RULE_EXPRESSIONS:
			list = a.Value
		}
	}
	for le := range nfnl.All(list) {
		var name string
		var data []byte
		for x := range nfnl.All(le.Value) {
			switch x.Type {
			case unix.NFTA_EXPR_NAME:
				name = x.String()
			case unix.NFTA_EXPR_DATA:
				data = x.Value
			}
		}
		d.expr(name, data)
	}
	return d.r
}

// ruleDecoder reads a rule's expressions in order, as the kernel runs
// them: what a payload or meta expression loads, a cmp compares.
type ruleDecoder struct {
	r           RuleState
	regs        [16][]byte // by register number; nat reads the ones immediates loaded
	saddrOffset uint32
	addrLen     uint32
	load        struct {
		ok   bool // the source address is loaded
		len  uint32
		mask []byte
		what string // "l4proto" or "dport" when that is loaded
		xor  []byte // a bitwise's xor: the bits a mark set sets
	}
}

// attrU32 is the 32-bit attribute t of an expression's data.
func attrU32(data []byte, t uint16) uint32 {
	v, _ := nfnl.Find(data, t)
	return nfnl.Attr{Value: v}.U32()
}

// attrValue is the value of the data attribute t of an expression's data.
func attrValue(data []byte, t uint16) []byte {
	x, _ := nfnl.Find(data, t)
	v, _ := nfnl.Find(x, unix.NFTA_DATA_VALUE)
	return v
}

func (d *ruleDecoder) expr(name string, data []byte) {
	switch name {
	case "payload":
		base, off := attrU32(data, unix.NFTA_PAYLOAD_BASE), attrU32(data, unix.NFTA_PAYLOAD_OFFSET)
		d.load.ok = base == unix.NFT_PAYLOAD_NETWORK_HEADER && off == d.saddrOffset
		d.load.len, d.load.mask, d.load.what = attrU32(data, unix.NFTA_PAYLOAD_LEN), nil, ""
		if base == unix.NFT_PAYLOAD_TRANSPORT_HEADER && off == 2 {
			d.load.what = "dport"
		}
	case "bitwise":
		d.load.mask = attrValue(data, unix.NFTA_BITWISE_MASK)
		d.load.xor = attrValue(data, unix.NFTA_BITWISE_XOR)
	case "cmp":
		d.cmp(data)
	case "immediate":
		d.immediate(data)
	case "nat":
		ar, pr := attrU32(data, unix.NFTA_NAT_REG_ADDR_MIN), attrU32(data, unix.NFTA_NAT_REG_PROTO_MIN)
		if attrU32(data, unix.NFTA_NAT_TYPE) == unix.NFT_NAT_DNAT && ar < uint32(len(d.regs)) && pr < uint32(len(d.regs)) && d.regs[ar] != nil {
			d.r.DNAT = net.IP(d.regs[ar]).String()
			if p := d.regs[pr]; pr != nft.RegVerdict && len(p) >= 2 {
				d.r.DNAT = net.JoinHostPort(d.r.DNAT, strconv.Itoa(int(binary.BigEndian.Uint16(p))))
			}
		}
	case "lookup":
		s, _ := nfnl.Find(data, unix.NFTA_LOOKUP_SET)
		if dreg, ok := nfnl.Find(data, unix.NFTA_LOOKUP_DREG); ok {
			if (nfnl.Attr{Value: dreg}).U32() == nft.RegVerdict {
				d.r.Lookup = nfnl.Attr{Value: s}.String()
			} else {
				d.r.DNATMap = nfnl.Attr{Value: s}.String() // its elements are read apart
			}
		} else if attrU32(data, unix.NFTA_LOOKUP_FLAGS)&unix.NFT_LOOKUP_F_INV == 0 {
			d.r.Member = nfnl.Attr{Value: s}.String()
		}
	case "masq":
		d.r.Masq = true
	case "meta":
		if _, ok := nfnl.Find(data, unix.NFTA_META_SREG); ok {
			d.r.SetMark = true
			if len(d.load.xor) == 4 {
				d.r.Mark = binary.NativeEndian.Uint32(d.load.xor)
			}
		}
		d.load.ok, d.load.what = false, ""
		if _, ok := nfnl.Find(data, unix.NFTA_META_DREG); ok && attrU32(data, unix.NFTA_META_KEY) == unix.NFT_META_L4PROTO {
			d.load.what = "l4proto"
		}
	case "fib":
		d.r.Fib = true
	}
}

// cmp reads a comparison with what was loaded: the protocol, the
// destination port (or the bounds of a range), the source prefix.
func (d *ruleDecoder) cmp(data []byte) {
	v, op := attrValue(data, unix.NFTA_CMP_DATA), attrU32(data, unix.NFTA_CMP_OP)
	switch {
	case op == unix.NFT_CMP_EQ && d.load.what == "l4proto" && len(v) == 1:
		d.r.Proto = protoName(v[0])
	case (op == unix.NFT_CMP_EQ || op == unix.NFT_CMP_GTE) && d.load.what == "dport" && len(v) == 2:
		d.r.Dport = int(binary.BigEndian.Uint16(v))
	case op == unix.NFT_CMP_LTE && d.load.what == "dport" && len(v) == 2:
		d.r.DportLast = int(binary.BigEndian.Uint16(v))
	}
	if d.load.ok && op == unix.NFT_CMP_EQ {
		ip := make(net.IP, d.addrLen)
		copy(ip, v)
		ones := int(d.load.len) * 8
		if d.load.mask != nil {
			ones = 0
			for _, byt := range d.load.mask {
				for ; byt != 0; byt <<= 1 {
					ones++
				}
			}
		}
		d.r.Saddr = prefixString(ip, ones, int(d.addrLen)*8)
	}
	d.load.ok = false
}

// immediate reads a verdict (a jump, a drop) or a value loaded into a
// register for nat.
func (d *ruleDecoder) immediate(data []byte) {
	imm, _ := nfnl.Find(data, unix.NFTA_IMMEDIATE_DATA)
	if dreg := attrU32(data, unix.NFTA_IMMEDIATE_DREG); dreg != nft.RegVerdict {
		if v, ok := nfnl.Find(imm, unix.NFTA_DATA_VALUE); ok && dreg < uint32(len(d.regs)) {
			d.regs[dreg] = v
		}
		return
	}
	vd, _ := nfnl.Find(imm, unix.NFTA_DATA_VERDICT)
	switch code, chain := nfnl.Verdict(vd); code {
	case unix.NFT_JUMP, unix.NFT_GOTO:
		d.r.Jump = chain
	case nfDrop:
		d.r.Drop = true
	}
}

// protoName is the protocol of an IP protocol number, "" for others.
func protoName(n byte) plan.Protocol {
	for _, p := range plan.Protocols {
		if protoNum(p) == n {
			return p
		}
	}
	return ""
}
