// Package plan turns a validated port-mapping request into the exact set of
// forwarding objects one attachment owns in one IP family. Build is pure: no
// I/O, no kernel state, so every backend renders the same plan and the golden
// tests pin it.
package plan

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"slices"
	"strconv"
	"sync"
)

// Plan is what one attachment owns in one family.
type Plan struct {
	Family Family
	Owner  Owner
	// ContainerNet is the container's address with its prefix (the hairpin
	// source match uses the prefix). Its IP is nil on DEL without prevResult.
	ContainerNet *net.IPNet
	Mappings     Mappings
	Masquerade   Masquerade
	// Conditions are extra match tokens for the entry rules, already
	// validated for the backend.
	Conditions []string
	// ForwardAccept lets the attachment's DNAT'd connections through a
	// DROP policy of iptables' filter FORWARD chain (forwardAccept).
	ForwardAccept bool
	// Localhost says how the node's own clients reach the host ports
	// ("localhost"); Socket is where the socket path lives when it is
	// LocalhostSocket.
	Localhost Localhost
	Socket    Socket

	// runs remembers Runs of Mappings (Build makes it): a verb asks for
	// them several times, and mappings out of order are sorted for them.
	runs *runsMemo
}

// Request is the family-independent input of Build.
type Request struct {
	Owner      Owner
	Mappings   Mappings
	Masquerade Masquerade
	ConditionsV4,
	ConditionsV6 []string
	ForwardAccept bool
	Localhost     Localhost
	Socket        Socket
}

// Build makes the plan of family f for containerNet (which may be nil on DEL
// without a prevResult: the plan then still names its owner and mappings).
// Mappings whose HostIP is of the other family are left out; unspecified host
// IPs (0.0.0.0, ::) become "any".
func Build(req Request, f Family, containerNet *net.IPNet) *Plan {
	p := &Plan{
		Family:        f,
		Owner:         req.Owner,
		Masquerade:    req.Masquerade,
		Conditions:    req.ConditionsV4,
		ForwardAccept: req.ForwardAccept,
		Localhost:     req.Localhost,
		Socket:        req.Socket,
	}
	if f == IPv6 {
		p.Conditions = req.ConditionsV6
	}
	if containerNet != nil {
		n := *containerNet
		p.ContainerNet = &n
	}
	p.Mappings = dedupe(ofFamily(req.Mappings, f))
	p.runs = &runsMemo{}
	return p
}

// ofFamily are the mappings of family f, "any" for an unspecified host
// IP. When that is all of them, as it is for a range, they are ms itself
// (its runs clipped: an Add cannot write into them), not a copy.
func ofFamily(ms Mappings, f Family) Mappings {
	keep := func(ip net.IP) bool { return ip == nil || (FamilyOf(ip) == f && !ip.IsUnspecified()) }
	all := true
	for i := 0; i < len(ms.seq) && all; i++ {
		all = keep(ms.seq[i].HostIP)
	}
	if all {
		ms.seq = slices.Clip(ms.seq)
		return ms
	}
	var out Mappings
	for _, r := range ms.seq {
		if r.HostIP != nil {
			if FamilyOf(r.HostIP) != f {
				continue
			}
			if r.HostIP.IsUnspecified() {
				r.HostIP = nil
			}
		}
		out.addRun(r)
	}
	return out
}

// dedupe drops the repeats of a mapping, keeping the first (in a new
// list: ms may be the request's). Mappings in strictly ascending order
// (a Podman range) have none: that is checked on their runs,
// without a set.
func dedupe(ms Mappings) Mappings {
	if ms.Ascending() {
		return ms
	}
	type mappingKey struct {
		hostIP                  [16]byte
		protocol                Protocol
		hostPort, containerPort int
	}
	seen := make(map[mappingKey]bool, ms.Len())
	var out Mappings
	for m := range ms.All() {
		key := mappingKey{protocol: m.Protocol, hostPort: m.HostPort, containerPort: m.ContainerPort}
		copy(key.hostIP[:], m.HostIP.To16())
		if !seen[key] {
			seen[key] = true
			out.Add(m)
		}
	}
	return out
}

// Empty reports whether the plan forwards nothing.
func (p *Plan) Empty() bool { return p.Mappings.Len() == 0 }

// HairpinSource is the source the hairpin mark rules match: the
// container's subnet, or every address with masqAll.
func (p *Plan) HairpinSource() string {
	if p.Masquerade.All {
		if p.Family == IPv6 {
			return "::/0"
		}
		return "0.0.0.0/0"
	}
	n := net.IPNet{IP: p.ContainerNet.IP.Mask(p.ContainerNet.Mask), Mask: p.ContainerNet.Mask}
	return n.String()
}

// LocalNet reports whether the attachment relies on route_localnet: IPv4
// with masquerading, where connections from 127.0.0.1 are DNATed out of
// the host. ADD turns route_localnet on for it, and the backends guard
// 127.0.0.0/8 against traffic from outside while it is on. The socket
// path needs none of it: its clients talk to the container directly.
func (p *Plan) LocalNet() bool {
	return p.Family == IPv4 && p.Masquerade.Enabled && p.Localhost != LocalhostSocket
}

// LocalhostRule reports whether connections from 127.0.0.1 get their own
// mark rule: IPv4 with masquerading, unless masqAll already marks every
// source.
func (p *Plan) LocalhostRule() bool { return p.LocalNet() && !p.Masquerade.All }

// Target is where m's connections are DNATed: the container's address
// and port, "192.0.2.2:80" or "[2001:db8::2]:80".
func (p *Plan) Target(m Mapping) string {
	return net.JoinHostPort(p.ContainerNet.IP.String(), strconv.Itoa(m.ContainerPort))
}

// Fingerprint names what plans map — per family the container's address
// and every mapping — so that two builds of one attachment's plans can be
// compared without keeping them: ADD records it, and the agent repairs an
// attachment only from a cache entry whose plans have the fingerprint of
// the owner's last ADD. Options that the host resolves (localhost: auto,
// the default backend) are left out: they cannot send a host port to
// another address.
func Fingerprint(plans []*Plan) string {
	h := sha256.New()
	// what is hashed goes through one small buffer: a range of 5000
	// ports is 45 KB of it, which would otherwise all be in memory
	b := make([]byte, 0, 4096)
	for _, p := range plans {
		b = append(b, byte(p.Family))
		if p.ContainerNet != nil {
			b = append(b, p.ContainerNet.IP.To16()...)
			b = append(b, p.ContainerNet.Mask...)
		}
		b = append(b, 0xff)
		for _, r := range p.Mappings.seq {
			// a record a mapping: its host IP, the length it was given
			// in, both ports, its protocol, 0; those of a run
			// differ in their ports alone, which are written into
			// copies of the first
			ip := r.HostIP.To16()
			size, ports := len(ip)+5+len(r.Protocol)+1, len(ip)+1
			for i := 0; i < r.Len; {
				if cap(b)-len(b) < size {
					h.Write(b)
					b = slices.Grow(b[:0], size)
				}
				k, first := min(r.Len-i, (cap(b)-len(b))/size), len(b)
				b = append(b, ip...)
				b = append(b, byte(len(r.HostIP)), 0, 0, 0, 0)
				b = append(b, r.Protocol...)
				b = append(b, 0)
				for n := size; n < k*size; n *= 2 {
					b = append(b, b[first:first+min(n, k*size-n)]...)
				}
				for at := first + ports; at < len(b); at += size {
					hp, cp := r.HostPort+i, r.ContainerPort+i
					b[at], b[at+1], b[at+2], b[at+3] = byte(hp>>8), byte(hp), byte(cp>>8), byte(cp)
					i++
				}
			}
		}
	}
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// runsMemo is Runs of the mappings it was computed for. A copy of
// the plan shares it, and a copy given other mappings computes its own.
type runsMemo struct {
	mu   sync.Mutex
	of   []Run
	n    int
	runs []Run
}
