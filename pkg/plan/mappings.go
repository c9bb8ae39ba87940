package plan

import (
	"iter"
	"strings"
)

// Mappings are mappings in the order a request gave them, held as the
// runs their consecutive entries make: an entry that continues the
// one before it (the same protocol and host IP, both ports one up) adds
// to its run instead of taking room of its own, so a Podman range of
// 5000 ports is one Run here, not 5000 Mappings. Expanding them gives
// back every entry, in order, repeats and all. The zero value is empty.
type Mappings struct {
	seq []Run
	n   int
}

// MappingsOf holds ms.
func MappingsOf(ms ...Mapping) Mappings {
	var l Mappings
	for _, m := range ms {
		l.Add(m)
	}
	return l
}

// Add appends m. It may change the last run in place, which a copy
// of l shares: build a list, then hand it on.
func (l *Mappings) Add(m Mapping) {
	l.addRun(Run{HostIP: m.HostIP, Protocol: m.Protocol, HostPort: m.HostPort, ContainerPort: m.ContainerPort, Len: 1})
}

// addRun appends the mappings of r, in order.
func (l *Mappings) addRun(r Run) {
	l.n += r.Len
	if k := len(l.seq); k > 0 {
		last := &l.seq[k-1]
		if r.HostPort == last.HostPort+last.Len && r.ContainerPort == last.ContainerPort+last.Len &&
			r.Protocol == last.Protocol && string(r.HostIP) == string(last.HostIP) {
			last.Len += r.Len
			return
		}
	}
	l.seq = append(l.seq, r)
}

// Len is the number of mappings.
func (l Mappings) Len() int { return l.n }

// All yields every mapping, in order.
func (l Mappings) All() iter.Seq[Mapping] {
	return func(yield func(Mapping) bool) {
		for _, r := range l.seq {
			for i := range r.Len {
				if !yield(Mapping{HostIP: r.HostIP, Protocol: r.Protocol, HostPort: r.HostPort + i, ContainerPort: r.ContainerPort + i}) {
					return
				}
			}
		}
	}
}

// Slice is every mapping, in order, in a new slice.
func (l Mappings) Slice() []Mapping {
	out := make([]Mapping, 0, l.n)
	for m := range l.All() {
		out = append(out, m)
	}
	return out
}

// Ascending reports whether every mapping's host IP, protocol and host
// port come strictly after the one's before it (compareMappings): there
// are then no repeats, nor two container ports for one host port.
func (l Mappings) Ascending() bool {
	for i := 1; i < len(l.seq); i++ {
		a, b := &l.seq[i-1], &l.seq[i]
		if compareMappings(Mapping{HostIP: a.HostIP, Protocol: a.Protocol, HostPort: a.Last()},
			Mapping{HostIP: b.HostIP, Protocol: b.Protocol, HostPort: b.HostPort}) >= 0 {
			return false
		}
	}
	return true
}

// HostPorts spells the host ports as "8080/tcp, 20000-20999/udp" in
// order, each run once (runs that differ only in host IP or
// container port are one).
func (l Mappings) HostPorts() string {
	var out []string
	seen := map[string]bool{}
	for _, r := range l.seq {
		s := r.Ports("-") + "/" + string(r.Protocol)
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return strings.Join(out, ", ")
}
