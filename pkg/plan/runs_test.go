package plan

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
)

func spell(runs []Run) string {
	var s []string
	for _, r := range runs {
		host := ""
		if r.HostIP != nil {
			host = r.HostIP.String() + ":"
		}
		s = append(s, fmt.Sprintf("%s%s/%s->%d", host, r.Ports("-"), r.Protocol, r.ContainerPort))
	}
	return strings.Join(s, " ")
}

func span(proto Protocol, host, container, n int) []Mapping {
	var out []Mapping
	for i := range n {
		out = append(out, Mapping{Protocol: proto, HostPort: host + i, ContainerPort: container + i})
	}
	return out
}

func TestRuns(t *testing.T) {
	hostIP := net.ParseIP("198.51.100.1").To4()
	cat := func(parts ...[]Mapping) []Mapping {
		var out []Mapping
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []Mapping
		want string
	}{
		{"none", nil, ""},
		{"one mapping", span(TCP, 8080, 80, 1), "8080/tcp->80"},
		{"an identity range", span(TCP, 10000, 10000, 1000), "10000-10999/tcp->10000"},
		{"an offset range", span(TCP, 8000, 80, 11), "8000-8010/tcp->80"},
		{"many host ports to one container port make no run", cat(span(TCP, 20000, 80, 1), span(TCP, 20001, 80, 1)), "20000/tcp->80 20001/tcp->80"},
		{"singles keep their order", cat(span(TCP, 8443, 443, 1), span(TCP, 8080, 80, 1)), "8443/tcp->443 8080/tcp->80"},
		{"given backwards", cat(span(TCP, 8081, 81, 1), span(TCP, 8080, 80, 1)), "8080-8081/tcp->80"},
		{"mixed protocols", cat(span(TCP, 5000, 5000, 3), span(UDP, 5000, 5000, 3)), "5000-5002/tcp->5000 5000-5002/udp->5000"},
		{"interleaved protocols", []Mapping{{Protocol: TCP, HostPort: 1, ContainerPort: 1}, {Protocol: UDP, HostPort: 1, ContainerPort: 1}, {Protocol: TCP, HostPort: 2, ContainerPort: 2}, {Protocol: UDP, HostPort: 2, ContainerPort: 2}}, "1-2/tcp->1 1-2/udp->1"},
		{"a gap in the middle", cat(span(TCP, 100, 100, 5), span(TCP, 106, 106, 5)), "100-104/tcp->100 106-110/tcp->106"},
		{"the offset changes", cat(span(TCP, 100, 100, 5), span(TCP, 105, 205, 5)), "100-104/tcp->100 105-109/tcp->205"},
		{"a host IP splits", cat(span(TCP, 100, 100, 2), []Mapping{{HostIP: hostIP, Protocol: TCP, HostPort: 102, ContainerPort: 102}}), "100-101/tcp->100 198.51.100.1:102/tcp->102"},
		{"duplicates count once", cat(span(TCP, 100, 100, 3), span(TCP, 100, 100, 3)), "100-102/tcp->100"},
		{"up to the last port", span(SCTP, 65530, 65530, 6), "65530-65535/sctp->65530"},
		{"every port", span(UDP, 1, 1, 65535), "1-65535/udp->1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := Runs(MappingsOf(tc.in...))
			if got := spell(runs); got != tc.want {
				t.Errorf("Runs = %q, want %q", got, tc.want)
			}
			// Expanded again, the runs are the distinct mappings.
			n := 0
			for _, r := range runs {
				for _, m := range r.Mappings() {
					if r.ContainerPortOf(m.HostPort) != m.ContainerPort {
						t.Errorf("%v: ContainerPortOf(%d) = %d", r, m.HostPort, r.ContainerPortOf(m.HostPort))
					}
					n++
				}
			}
			distinct := map[string]bool{}
			for _, m := range tc.in {
				distinct[m.String()] = true
			}
			if n != len(distinct) {
				t.Errorf("runs expand to %d mappings, want %d", n, len(distinct))
			}
		})
	}
}

// The one-pass coalescing gives what the set-based one gives, whenever
// it says it does: random mappings, few ports and protocols so that they
// touch, overlap and repeat.
func TestLinearRunsAgreeWithTheSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ips := []net.IP{nil, net.ParseIP("198.51.100.1").To4(), net.ParseIP("198.51.100.1")}
	linear := 0
	for i := 0; i < 20000; i++ {
		ms := make([]Mapping, rng.IntN(8))
		base := rng.IntN(3)
		for j := range ms {
			if j > 0 && rng.IntN(3) > 0 { // mostly a continuation
				ms[j] = ms[j-1]
				ms[j].HostPort++
				ms[j].ContainerPort++
				continue
			}
			ms[j] = Mapping{HostIP: ips[rng.IntN(len(ips))], Protocol: Protocols[rng.IntN(2)], HostPort: 100 + rng.IntN(12), ContainerPort: 100 + base + rng.IntN(12)}
		}
		l := MappingsOf(ms...)
		if !linearRuns(l.seq) {
			continue
		}
		linear++
		if got, want := l.seq, runsBySet(l); spell(got) != spell(want) {
			t.Fatalf("mappings %v:\n linear %s\n set    %s", ms, spell(got), spell(want))
		}
	}
	if linear < 5000 {
		t.Errorf("the one pass answered %d of 20000 cases: the check is too strict to matter", linear)
	}
}
