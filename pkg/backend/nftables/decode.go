package nftables

import (
	"encoding/binary"
	"net/netip"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// decodeElements reads the elements of a GETSETELEM answer.
func decodeElements(f plan.Family, b []byte) []Element {
	var out []Element
	ipLen := int(nft.Family(f).AddrType().Len)
	for _, e := range nft.DecodeElements(b) {
		k, ok := keyFromBytes(f, e.Set.Name, e.Key)
		if !ok {
			continue
		}
		if end, ok := keyFromBytes(f, e.Set.Name, e.KeyEnd); ok && end.Port > k.Port {
			k.Last = end.Port
		}
		if !k.Flat {
			out = append(out, Element{Key: k, Chain: e.Goto})
		} else if len(e.Data) >= ipLen+2 {
			chain, srcs := parseFlatComment(e.Comment)
			out = append(out, Element{Key: k, Chain: chain, To: targetOf(e.Data[:ipLen], e.Data[ipLen:]), Srcs: srcs})
		}
	}
	return out
}

// decodeDNATs reads the elements of a DNAT map (dnatMap) out of a
// GETSETELEM answer, or a NEWSETELEM request: keys of protocol and port,
// with or without a host address before them, by their length.
func decodeDNATs(f plan.Family, b []byte) []MapDNAT {
	ipLen := int(nft.Family(f).AddrType().Len)
	var out []MapDNAT
	for _, e := range nft.DecodeElements(b) {
		set := hostPortsMap
		if len(e.Key) == 8+ipLen {
			set = hostIPPortsMap
		}
		if k, ok := keyFromBytes(f, set, e.Key); ok && len(e.Data) >= ipLen+2 {
			out = append(out, MapDNAT{Key: k, To: targetOf(e.Data[:ipLen], e.Data[ipLen:])})
		}
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
		k.HostIP, _ = netip.AddrFromSlice(b[:n])
		b = b[n:]
	case hostPortsMap, hostPortRangesMap, HostDNATMap:
	default:
		return k, false
	}
	k.Flat = isDNATMap(set)
	if len(b) < 6 {
		return k, false
	}
	if k.Protocol = plan.Protocol(nft.ProtoName(b[0])); k.Protocol == "" {
		return k, false
	}
	k.Port = int(binary.BigEndian.Uint16(b[4:6]))
	return k, true
}

// decodeRule reads a rule message's parsed attributes.
func decodeRule(f plan.Family, attrs []nfnl.Attr) RuleState {
	return RuleState{Rule: nft.DecodeRule(nft.Family(f), attrs)}
}
