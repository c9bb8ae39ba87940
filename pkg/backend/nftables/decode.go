package nftables

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
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
			data := nft.ValueOf(le.Value, unix.NFTA_SET_ELEM_DATA)
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
		key, data := nft.ValueOf(le.Value, unix.NFTA_SET_ELEM_KEY), nft.ValueOf(le.Value, unix.NFTA_SET_ELEM_DATA)
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
	return RuleState{RuleInfo: nft.DecodeRule(nft.Family(f), attrs)}
}
