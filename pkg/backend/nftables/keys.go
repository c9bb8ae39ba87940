package nftables

import (
	"cmp"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Key is a map key an attachment claims: (host IP,) protocol, host port
// — or, with Last, the interval of host ports Port-Last.
// Keys are comparable: a map of them needs no string of its own.
type Key struct {
	HostIP   netip.Addr // the zero Addr: the wildcard maps
	Protocol plan.Protocol
	Port     int
	// Last is the last port of an interval key (an identity run of ports,
	// in the ranges maps); 0 for a key of one port.
	Last int
	// Flat says the key lives in a DNAT map (flat.go): its element holds
	// the container's address and port, not a verdict. Only keys of one
	// port are flat.
	Flat bool
}

// IsRange reports whether the key is an interval of ports.
func (k Key) IsRange() bool { return k.Last > k.Port }

// last is the key's last port (Port for a key of one port).
func (k Key) last() int { return max(k.Port, k.Last) }

// Map is the map the key lives in.
func (k Key) Map() string {
	switch {
	case k.Flat && k.HostIP.IsValid():
		return hostIPDNATMap
	case k.Flat:
		return HostDNATMap
	case k.HostIP.IsValid() && k.IsRange():
		return hostIPPortRangesMap
	case k.HostIP.IsValid():
		return hostIPPortsMap
	case k.IsRange():
		return hostPortRangesMap
	}
	return hostPortsMap
}

// String is the key as nft prints it: "[198.51.100.1 . ]tcp . 8080", an
// interval "tcp . 20000-20999".
func (k Key) String() string {
	b := make([]byte, 0, 48)
	if k.HostIP.IsValid() {
		b = append(k.HostIP.AppendTo(b), " . "...)
	}
	b = strconv.AppendInt(append(append(b, k.Protocol...), " . "...), int64(k.Port), 10)
	if k.IsRange() {
		b = strconv.AppendInt(append(b, '-'), int64(k.Last), 10)
	}
	return string(b)
}

// inOtherMap is the key of the same port in the other kind of exact map:
// a verdict map's for a flat key, a DNAT map's for a key of one port in
// a verdict map. The dispatch chain looks the verdict map up first, so
// where both hold a port the verdict map's key shadows the flat element:
// an attachment that takes a port over deletes that key too.
func (k Key) inOtherMap() Key {
	k.Flat = !k.Flat
	return k
}

// withOtherMaps is keys and, for those of one port, their keys in the
// other kind of map.
func withOtherMaps(keys []Key) []Key {
	out := make([]Key, 0, 2*len(keys))
	for _, k := range keys {
		out = append(out, k)
		if !k.IsRange() {
			out = append(out, k.inOtherMap())
		}
	}
	return out
}

// ipOf is a key's host IP as the plan spells it; nil for the wildcard.
func ipOf(a netip.Addr) net.IP {
	if !a.IsValid() {
		return nil
	}
	return net.IP(a.AsSlice())
}

// compareKeys orders keys by map, host IP, protocol and ports.
func compareKeys(a, b Key) int {
	return cmp.Or(strings.Compare(a.Map(), b.Map()), a.HostIP.Compare(b.HostIP),
		strings.Compare(string(a.Protocol), string(b.Protocol)), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Last, b.Last))
}

// port is the key as a port's identity, whichever map holds it.
func (k Key) port() Key {
	k.Flat = false
	return k
}

// parseKey reads a key back from its String form.
func parseKey(s string) (Key, bool) {
	f := strings.Split(s, " . ")
	var k Key
	if len(f) == 3 {
		a, err := netip.ParseAddr(f[0])
		if err != nil || a.Zone() != "" {
			return k, false
		}
		k.HostIP = a.Unmap()
		f = f[1:]
	}
	if len(f) != 2 {
		return k, false
	}
	proto, ok := plan.ParseProtocol(f[0])
	from, to, isRange := strings.Cut(f[1], "-")
	port, err := strconv.Atoi(from)
	if !ok || f[0] == "" || err != nil || port < 0 || port > 65535 {
		return k, false
	}
	k.Protocol, k.Port = proto, port
	if isRange {
		last, err := strconv.Atoi(to)
		if err != nil || last <= port || last > 65535 {
			return k, false
		}
		k.Last = last
	}
	return k, true
}

// prefixString spells ip masked to ones bits as a CIDR.
func prefixString(ip net.IP, ones, bits int) string {
	n := net.IPNet{IP: ip, Mask: net.CIDRMask(ones, bits)}
	n.IP = n.IP.Mask(n.Mask)
	return n.String()
}
