package plan

import (
	"cmp"
	"slices"
	"sort"
)

// Runs coalesces mappings into the fewest runs: each starts at a mapping
// whose host port and container port are not both one more than another
// mapping's of the same protocol and host IP, and takes every mapping
// that continues it. Runs come in the order of their first mapping, so
// mappings that make no run keep their order; duplicates count once.
func Runs(ms Mappings) []Run {
	if linearRuns(ms.seq) {
		return ms.seq
	}
	return runsBySet(ms)
}

// runsBySet is Runs for any mappings: a set of every mapping's host
// port says where each run starts and how far it goes.
func runsBySet(ms Mappings) []Run {
	type key struct {
		hostIP   [16]byte // zero: every address
		protocol Protocol
		port     int
	}
	keyOf := func(m Mapping, port int) key {
		k := key{protocol: m.Protocol, port: port}
		copy(k.hostIP[:], m.HostIP.To16())
		return k
	}
	to := make(map[key]int, ms.Len()) // host port -> container port
	for m := range ms.All() {
		to[keyOf(m, m.HostPort)] = m.ContainerPort
	}
	var out []Run
	started := make(map[key]bool)
	for m := range ms.All() {
		if cp, ok := to[keyOf(m, m.HostPort-1)]; ok && cp == m.ContainerPort-1 {
			continue // a run that starts lower takes it
		}
		k := keyOf(m, m.HostPort)
		if started[k] {
			continue
		}
		started[k] = true
		r := Run{HostIP: m.HostIP, Protocol: m.Protocol, HostPort: m.HostPort, ContainerPort: m.ContainerPort, Len: 1}
		for {
			cp, ok := to[keyOf(m, r.HostPort+r.Len)]
			if !ok || cp != r.ContainerPortOf(r.HostPort+r.Len) || r.HostPort+r.Len > 65535 {
				break
			}
			r.Len++
		}
		out = append(out, r)
	}
	return out
}

// linearRuns reports whether the stretches a Mappings holds (Mappings.seq:
// each already takes every entry that continues it) are the runs Runs
// defines: no two overlap or would join — checked on them sorted, which
// they are already for a Podman range and most runtimes' mappings.
func linearRuns(seq []Run) bool {
	less := func(a, b Run) bool {
		return cmp.Or(compareIPs(a.HostIP, b.HostIP), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.HostPort, b.HostPort)) < 0
	}
	sorted := seq // in ascending order they need no sorted copy
	for i := 1; i < len(seq); i++ {
		if less(seq[i], seq[i-1]) {
			sorted = slices.Clone(seq)
			sort.Slice(sorted, func(i, j int) bool { return less(sorted[i], sorted[j]) })
			break
		}
	}
	for i := 1; i < len(sorted); i++ {
		a, b := sorted[i-1], sorted[i]
		if a.Protocol != b.Protocol || compareIPs(a.HostIP, b.HostIP) != 0 {
			continue
		}
		if b.HostPort <= a.Last() || (b.HostPort == a.Last()+1 && b.ContainerPort == a.ContainerPortOf(b.HostPort)) {
			return false
		}
	}
	return true
}

// Runs are the plan's mappings coalesced (Runs), computed once for the
// plan's mappings: change them in place, and the runs are stale. The
// caller must not change them.
func (p *Plan) Runs() []Run {
	m, seq := p.runs, p.Mappings.seq
	if m == nil || len(seq) == 0 {
		return Runs(p.Mappings)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.of) != len(seq) || m.n != p.Mappings.n || &m.of[0] != &seq[0] {
		m.of, m.n, m.runs = seq, p.Mappings.n, Runs(p.Mappings)
	}
	return m.runs
}
