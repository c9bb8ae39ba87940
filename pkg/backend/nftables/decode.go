package nftables

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"golang.org/x/sys/unix"
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

// commentOf reads the comment out of libnftnl user data.
func commentOf(b []byte) string {
	for len(b) >= 2 {
		t, l := b[0], int(b[1])
		if 2+l > len(b) {
			break
		}
		if t == udataComment {
			s, _, _ := strings.Cut(string(b[2:2+l]), "\x00")
			return s
		}
		b = b[2+l:]
	}
	return ""
}

// Element is one element of a dispatch map: its key (an interval key in
// the ranges maps) and the chain its verdict names.
type Element struct {
	Key   Key
	Chain string
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
		if endAttr, ok := nfnl.Find(le.Value, nftaSetElemKeyEnd); ok {
			end, _ := nfnl.Find(endAttr, unix.NFTA_DATA_VALUE)
			if e, ok := keyFromBytes(f, set, end); ok && e.Port > k.Port {
				k.Last = e.Port
			}
		}
		data, _ := nfnl.Find(le.Value, unix.NFTA_SET_ELEM_DATA)
		v, _ := nfnl.Find(data, unix.NFTA_DATA_VERDICT)
		ch, _ := nfnl.Find(v, unix.NFTA_VERDICT_CHAIN)
		chain, _, _ := strings.Cut(string(ch), "\x00")
		out = append(out, Element{Key: k, Chain: chain})
	}
	return out
}

// keyFromBytes reads a key of map set back (Key.bytes): the first port of
// an interval key.
func keyFromBytes(f plan.Family, set string, b []byte) (Key, bool) {
	var k Key
	switch set {
	case HostIPPortsMap, HostIPPortRangesMap:
		n := 4
		if f == plan.IPv6 {
			n = 16
		}
		if len(b) < n {
			return k, false
		}
		k.HostIP = append(net.IP(nil), b[:n]...)
		b = b[n:]
	case HostPortsMap, HostPortRangesMap:
	default:
		return k, false
	}
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
	var r RuleState
	var list []byte
	for _, a := range attrs {
		switch a.Type {
		case unix.NFTA_RULE_HANDLE:
			if len(a.Value) == 8 {
				r.Handle = binary.BigEndian.Uint64(a.Value)
			}
		case nftaRuleUserdata:
			r.Comment = commentOf(a.Value)
		case unix.NFTA_RULE_EXPRESSIONS:
			list = a.Value
		}
	}
	var regs [16][]byte // by register number; nat reads the ones immediates loaded
	saddrOffset, addrLen := addrOffset(f, false)
	var load struct {
		ok   bool // the source address is loaded
		len  uint32
		mask []byte
		what string // "l4proto" or "dport" when that is loaded
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
		u32 := func(t uint16) uint32 {
			v, _ := nfnl.Find(data, t)
			return nfnl.Attr{Value: v}.U32()
		}
		value := func(t uint16) []byte {
			x, _ := nfnl.Find(data, t)
			v, _ := nfnl.Find(x, unix.NFTA_DATA_VALUE)
			return v
		}
		switch name {
		case "payload":
			load.ok = u32(unix.NFTA_PAYLOAD_BASE) == unix.NFT_PAYLOAD_NETWORK_HEADER && u32(unix.NFTA_PAYLOAD_OFFSET) == saddrOffset
			load.len, load.mask, load.what = u32(unix.NFTA_PAYLOAD_LEN), nil, ""
			if u32(unix.NFTA_PAYLOAD_BASE) == unix.NFT_PAYLOAD_TRANSPORT_HEADER && u32(unix.NFTA_PAYLOAD_OFFSET) == 2 {
				load.what = "dport"
			}
		case "bitwise":
			load.mask = value(unix.NFTA_BITWISE_MASK)
		case "cmp":
			switch v, op := value(unix.NFTA_CMP_DATA), u32(unix.NFTA_CMP_OP); {
			case op == unix.NFT_CMP_EQ && load.what == "l4proto" && len(v) == 1:
				r.Proto = protoName(v[0])
			case (op == unix.NFT_CMP_EQ || op == unix.NFT_CMP_GTE) && load.what == "dport" && len(v) == 2:
				r.Dport = int(binary.BigEndian.Uint16(v))
			case op == unix.NFT_CMP_LTE && load.what == "dport" && len(v) == 2:
				r.DportLast = int(binary.BigEndian.Uint16(v))
			}
			if load.ok && u32(unix.NFTA_CMP_OP) == unix.NFT_CMP_EQ {
				ip := make(net.IP, addrLen)
				copy(ip, value(unix.NFTA_CMP_DATA))
				ones := int(load.len) * 8
				if load.mask != nil {
					ones = 0
					for _, byt := range load.mask {
						for ; byt != 0; byt <<= 1 {
							ones++
						}
					}
				}
				r.Saddr = prefixString(ip, ones, int(addrLen)*8)
			}
			load.ok = false
		case "immediate":
			imm, _ := nfnl.Find(data, unix.NFTA_IMMEDIATE_DATA)
			if dreg := u32(unix.NFTA_IMMEDIATE_DREG); dreg != regVerdict {
				if v, ok := nfnl.Find(imm, unix.NFTA_DATA_VALUE); ok && dreg < uint32(len(regs)) {
					regs[dreg] = v
				}
				break
			}
			vd, _ := nfnl.Find(imm, unix.NFTA_DATA_VERDICT)
			switch code, chain := nfnl.Verdict(vd); code {
			case unix.NFT_JUMP, unix.NFT_GOTO:
				r.Jump = chain
			case nfDrop:
				r.Drop = true
			}
		case "nat":
			ar, pr := u32(unix.NFTA_NAT_REG_ADDR_MIN), u32(unix.NFTA_NAT_REG_PROTO_MIN)
			if u32(unix.NFTA_NAT_TYPE) == unix.NFT_NAT_DNAT && ar < uint32(len(regs)) && pr < uint32(len(regs)) {
				r.DNAT = net.IP(regs[ar]).String()
				if p := regs[pr]; pr != regVerdict && len(p) >= 2 {
					r.DNAT = net.JoinHostPort(r.DNAT, strconv.Itoa(int(binary.BigEndian.Uint16(p))))
				}
			}
		case "lookup":
			if _, ok := nfnl.Find(data, unix.NFTA_LOOKUP_DREG); ok {
				s, _ := nfnl.Find(data, unix.NFTA_LOOKUP_SET)
				r.Lookup = nfnl.Attr{Value: s}.String()
			}
		case "masq":
			r.Masq = true
		case "meta":
			if _, ok := nfnl.Find(data, unix.NFTA_META_SREG); ok {
				r.SetMark = true
			}
			load.ok, load.what = false, ""
			if _, ok := nfnl.Find(data, unix.NFTA_META_DREG); ok && u32(unix.NFTA_META_KEY) == unix.NFT_META_L4PROTO {
				load.what = "l4proto"
			}
		case "fib":
			r.Fib = true
		}
	}
	return r
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
