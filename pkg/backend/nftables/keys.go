package nftables

import (
	"net"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Key is a map key an attachment claims: (host IP,) protocol, host port
// — or, with Last, the interval of host ports Port-Last.
type Key struct {
	HostIP   net.IP // nil: the wildcard maps
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
	case k.Flat && k.HostIP != nil:
		return hostIPDNATMap
	case k.Flat:
		return HostDNATMap
	case k.HostIP != nil && k.IsRange():
		return hostIPPortRangesMap
	case k.HostIP != nil:
		return hostIPPortsMap
	case k.IsRange():
		return hostPortRangesMap
	}
	return hostPortsMap
}

// Fields are the key's concatenation, as nft prints it.
func (k Key) Fields() []string {
	port := strconv.Itoa(k.Port)
	if k.IsRange() {
		port += "-" + strconv.Itoa(k.Last)
	}
	f := []string{string(k.Protocol), port}
	if k.HostIP != nil {
		f = append([]string{k.HostIP.String()}, f...)
	}
	return f
}

func (k Key) String() string {
	if k.HostIP != nil {
		return strings.Join(k.Fields(), " . ")
	}
	// the usual key, without the slice Fields makes: one for every mapping
	b := make([]byte, 0, len(k.Protocol)+16)
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
		if k.HostIP = net.ParseIP(f[0]); k.HostIP == nil {
			return k, false
		}
		if v4 := k.HostIP.To4(); v4 != nil {
			k.HostIP = v4
		}
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

// samePrefix reports whether a read-back source prefix is spec (an
// address or a CIDR).
func samePrefix(got, spec string) bool {
	a, b := nft.ParsePrefix(got), nft.ParsePrefix(spec)
	return a.String() == b.String()
}

// prefixString spells ip masked to ones bits as a CIDR.
func prefixString(ip net.IP, ones, bits int) string {
	n := net.IPNet{IP: ip, Mask: net.CIDRMask(ones, bits)}
	n.IP = n.IP.Mask(n.Mask)
	return n.String()
}
