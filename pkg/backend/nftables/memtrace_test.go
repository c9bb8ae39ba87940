package nftables

import (
	"net"
	"net/netip"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Trace follows p through family f's cni_portmap table as the kernel's
// nat hooks would: the base chain of its hook, the local-address check
// (local says which addresses are this host's), the dispatch map, the
// attachment's chain, the mark and masquerade chains. Rules holding
// conditions are taken as matching.
func (m *Memory) Trace(f plan.Family, p plan.Packet, local func(net.IP) bool) plan.Verdict {
	var v plan.Verdict
	t, err := m.Table(f, Table)
	if err != nil || t == nil {
		return v
	}
	base := "prerouting" // the base chains' names are their hooks'
	if p.FromHost {
		base = "output"
	}
	var marks uint32
	var walk func(chain string, depth int) bool // true: a terminal verdict
	walk = func(chain string, depth int) bool {
		c := t.Chains[chain]
		if c == nil || depth > 8 {
			return false
		}
		for _, r := range c.Rules {
			switch {
			case r.Fib && !local(p.Dst),
				r.Proto != "" && r.Proto != string(p.Protocol),
				r.Dport != 0 && (p.Dport < r.Dport || p.Dport > max(r.Dport, r.DportLast)),
				r.Saddr != "" && !nft.ParsePrefix(r.Saddr).Contains(p.Src):
				continue
			}
			if r.Member != "" {
				if !hairpinHolds(t, r.Member, p) {
					continue
				}
			}
			if r.DNATMap != "" && !strings.HasPrefix(r.DNATMap, "__") {
				k := Key{Protocol: p.Protocol, Port: p.Dport, Flat: true}
				if r.DNATMap == hostIPDNATMap {
					k.HostIP = addrOf(p.Dst)
				}
				e, ok := t.Elements[k]
				if !ok {
					continue // a miss ends the rule
				}
				v.Chain, v.DNAT = e.Chain, e.To.String()
				return true
			}
			if r.Lookup != "" {
				k := Key{Protocol: p.Protocol, Port: p.Dport}
				if r.Lookup == hostIPPortsMap || r.Lookup == hostIPPortRangesMap {
					k.HostIP = addrOf(p.Dst)
				}
				if to, ok := lookup(t.Elements, r.Lookup, k); ok {
					v.Chain = to
					return walk(to, depth+1) || true // a goto does not come back
				}
				continue
			}
			if r.DNATMap != "" {
				to, ok := lookupDNAT(r.DNATs, p)
				if !ok {
					continue // a miss ends the rule, as the kernel's lookup does
				}
				v.DNAT = to
				return true
			}
			if r.SetMark {
				marks |= r.Mark
			}
			if to := r.DNAT.To; to.IsValid() {
				if to.Port() == 0 { // the port stays
					to = netip.AddrPortFrom(to.Addr(), uint16(p.Dport))
				}
				v.DNAT = to.String()
				return true
			}
			if r.Jump != "" && walk(r.Jump, depth+1) {
				return true
			}
		}
		return false
	}
	walk(base, 0)
	for bit := range 32 {
		if marks&(1<<bit) != 0 && v.DNAT != "" {
			if mc := t.Chains[masqChain(bit)]; mc != nil && len(mc.Rules) > 0 && mc.Rules[0].Masq {
				v.Masquerade = true
			}
		}
	}
	return v
}

// hairpinHolds reports whether hairpin set name of t holds p: its source
// in an element's prefix, for its key.
func hairpinHolds(t *State, name string, p plan.Packet) bool {
	addr, ones, ok := hairpinLength(name)
	if !ok {
		return false
	}
	k := Key{Protocol: p.Protocol, Port: p.Dport, Flat: true}
	if addr {
		k.HostIP = addrOf(p.Dst)
	}
	bits := 128
	if p.Src.To4() != nil {
		bits = 32
	}
	want := Hairpin{Src: prefixString(p.Src, ones, bits), Key: k}.id()
	for _, h := range t.Hairpins {
		if h.id() == want {
			return true
		}
	}
	return false
}

// lookup finds the element of map name holding k: its own, or an
// interval holding its port (els: every map's elements by key), and the
// chain it names.
func lookup(els map[Key]Element, name string, k Key) (string, bool) {
	for e, el := range els {
		if e.Map() == name && !e.Flat && (e == k || e.IsRange() && overlaps(e, k)) {
			return el.Chain, true
		}
	}
	return "", false
}

// lookupDNAT finds p's key among a DNAT map's elements: protocol and
// port, and the destination address for a map keyed by it.
func lookupDNAT(els []MapDNAT, p plan.Packet) (string, bool) {
	for _, e := range els {
		if e.Key.Protocol == p.Protocol && e.Key.Port == p.Dport && (!e.Key.HostIP.IsValid() || e.Key.HostIP == addrOf(p.Dst)) {
			return e.To.String(), true
		}
	}
	return "", false
}
