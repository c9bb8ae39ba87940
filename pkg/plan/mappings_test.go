package plan

import (
	"math/rand/v2"
	"net"
	"slices"
	"testing"
)

// Mappings hold their entries as runs and give every one back, in
// order, repeats and all; a run is never longer than the entries
// that continue one another, and a host IP keeps the bytes it came with.
func TestMappingsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	ips := []net.IP{nil, net.ParseIP("198.51.100.1").To4(), net.ParseIP("198.51.100.1"), net.ParseIP("2001:db8::1")}
	for i := 0; i < 5000; i++ {
		ms := make([]Mapping, rng.IntN(10))
		for j := range ms {
			if j > 0 && rng.IntN(3) > 0 {
				ms[j] = ms[j-1]
				ms[j].HostPort++
				ms[j].ContainerPort++
				continue
			}
			ms[j] = Mapping{HostIP: ips[rng.IntN(len(ips))], Protocol: Protocols[rng.IntN(2)], HostPort: 100 + rng.IntN(12), ContainerPort: 100 + rng.IntN(12)}
		}
		l := MappingsOf(ms...)
		got := l.Slice()
		if l.Len() != len(ms) || !slices.EqualFunc(got, ms, func(a, b Mapping) bool {
			return a.String() == b.String() && len(a.HostIP) == len(b.HostIP)
		}) {
			t.Fatalf("MappingsOf(%v): Len %d, Slice %v", ms, l.Len(), got)
		}
		breaks := 0
		for j := 1; j < len(ms); j++ {
			a, b := ms[j-1], ms[j]
			if b.HostPort != a.HostPort+1 || b.ContainerPort != a.ContainerPort+1 || b.Protocol != a.Protocol || string(a.HostIP) != string(b.HostIP) {
				breaks++
			}
		}
		if want := min(len(ms), breaks+1); len(l.seq) != want {
			t.Fatalf("MappingsOf(%v): %d runs, want %d", ms, len(l.seq), want)
		}
		ascending := true
		for j := 1; j < len(ms); j++ {
			a, b := ms[j-1], ms[j]
			b.ContainerPort, a.ContainerPort = 0, 0
			ascending = ascending && compareMappings(a, b) < 0
		}
		if l.Ascending() != ascending {
			t.Fatalf("MappingsOf(%v).Ascending() = %v", ms, !ascending)
		}
	}
	if l := MappingsOf(span(TCP, 20000, 20000, 5000)...); len(l.seq) != 1 || l.Len() != 5000 || !l.Ascending() {
		t.Errorf("a range of 5000 ports: %d runs, Len %d", len(l.seq), l.Len())
	}
}

// A fingerprint is what the ledger records hold: these are the values of
// the same plans from before mappings were held as runs, and must
// not change.
func TestFingerprintUnchanged(t *testing.T) {
	n4 := &net.IPNet{IP: net.ParseIP("192.0.2.2").To4(), Mask: net.CIDRMask(24, 32)}
	n6 := &net.IPNet{IP: net.ParseIP("2001:db8::2"), Mask: net.CIDRMask(64, 128)}
	mixed := MappingsOf(
		Mapping{HostPort: 8080, ContainerPort: 80, Protocol: TCP},
		Mapping{HostPort: 8081, ContainerPort: 81, Protocol: TCP},
		Mapping{HostIP: net.ParseIP("198.51.100.1").To4(), HostPort: 53, ContainerPort: 53, Protocol: UDP},
		Mapping{HostIP: net.ParseIP("198.51.100.1"), HostPort: 54, ContainerPort: 54, Protocol: UDP},
		Mapping{HostPort: 9000, ContainerPort: 9000, Protocol: SCTP},
		Mapping{HostPort: 8080, ContainerPort: 80, Protocol: TCP},
	)
	v6 := MappingsOf(Mapping{HostIP: net.ParseIP("2001:db8::1"), HostPort: 443, ContainerPort: 8443, Protocol: TCP})
	for want, plans := range map[string][]*Plan{
		"ec55f839a5fc91f42f895025d8cefcbf": {{Family: IPv4, ContainerNet: n4, Mappings: MappingsOf(span(TCP, 20000, 20000, 5000)...)}},
		"77354fa097bef05d337a6a2dcdce2813": {{Family: IPv4, ContainerNet: n4, Mappings: mixed}, {Family: IPv6, ContainerNet: n6, Mappings: v6}},
		"00d936536092e662cc3b88643378990d": {{Family: IPv4, Mappings: mixed}},
		"63a4d01d7555a9cef95ba4eec6fdd9cb": {{Family: IPv6, ContainerNet: n6}},
	} {
		if got := Fingerprint(plans); got != want {
			t.Errorf("Fingerprint = %s, want %s (the ledger's records would no longer match)", got, want)
		}
	}
}

func TestHostPorts(t *testing.T) {
	v4, v6 := net.ParseIP("198.51.100.1").To4(), net.ParseIP("2001:db8::1")
	for _, c := range []struct {
		ms   []Mapping
		want string
	}{
		{nil, ""},
		{[]Mapping{{Protocol: TCP, HostPort: 8080, ContainerPort: 80}}, "8080/tcp"},
		{[]Mapping{{Protocol: TCP, HostPort: 8080, ContainerPort: 80}, {Protocol: TCP, HostPort: 8081, ContainerPort: 81},
			{Protocol: UDP, HostPort: 53, ContainerPort: 53}}, "8080-8081/tcp, 53/udp"},
		{[]Mapping{{HostIP: v4, Protocol: TCP, HostPort: 8080, ContainerPort: 80}, {HostIP: v6, Protocol: TCP, HostPort: 8080, ContainerPort: 80}},
			"8080/tcp"},
	} {
		if got := MappingsOf(c.ms...).HostPorts(); got != c.want {
			t.Errorf("HostPorts(%v) = %q, want %q", c.ms, got, c.want)
		}
	}
}
