package plan

import (
	"net"
	"strings"
	"testing"
)

func TestBuildFiltersByFamily(t *testing.T) {
	req := Request{
		Owner: Owner{Network: "net1", ContainerID: "c1", IfName: "eth0"},
		Mappings: MappingsOf([]Mapping{
			{HostPort: 80, ContainerPort: 8080, Protocol: TCP},
			{HostIP: net.ParseIP("198.51.100.1").To4(), HostPort: 53, ContainerPort: 53, Protocol: UDP},
			{HostIP: net.ParseIP("2001:db8::1"), HostPort: 54, ContainerPort: 54, Protocol: UDP},
			{HostIP: net.ParseIP("0.0.0.0").To4(), HostPort: 81, ContainerPort: 81, Protocol: TCP},
			{HostIP: net.ParseIP("::"), HostPort: 82, ContainerPort: 82, Protocol: SCTP},
			{HostPort: 80, ContainerPort: 8080, Protocol: TCP}, // exact duplicate
		}...),
		ConditionsV4: []string{"-s", "192.0.2.0/24"},
		ConditionsV6: []string{"-s", "2001:db8::/32"},
	}
	tests := []struct {
		f     Family
		want  string
		conds string
	}{
		{IPv4, "*:80/tcp->8080 198.51.100.1:53/udp->53 *:81/tcp->81", "-s 192.0.2.0/24"},
		{IPv6, "*:80/tcp->8080 2001:db8::1:54/udp->54 *:82/sctp->82", "-s 2001:db8::/32"},
	}
	for _, tt := range tests {
		t.Run(tt.f.String(), func(t *testing.T) {
			p := Build(req, tt.f, nil)
			var got []string
			for m := range p.Mappings.All() {
				got = append(got, m.String())
			}
			if strings.Join(got, " ") != tt.want {
				t.Errorf("mappings %v, want %s", got, tt.want)
			}
			if strings.Join(p.Conditions, " ") != tt.conds {
				t.Errorf("conditions %v, want %s", p.Conditions, tt.conds)
			}
		})
	}
}

func TestBuildOtherFamilyOnlyIsEmpty(t *testing.T) {
	req := Request{Mappings: MappingsOf(Mapping{HostIP: net.ParseIP("::1"), HostPort: 80, ContainerPort: 80, Protocol: TCP})}
	if p := Build(req, IPv4, nil); !p.Empty() {
		t.Errorf("IPv4 plan of an IPv6-only mapping has %v", p.Mappings)
	}
}

func TestParseProtocol(t *testing.T) {
	for in, want := range map[string]Protocol{"": TCP, "TCP": TCP, "udp": UDP, "Sctp": SCTP} {
		if got, ok := ParseProtocol(in); !ok || got != want {
			t.Errorf("ParseProtocol(%q) = %q, %v", in, got, ok)
		}
	}
	for _, in := range []string{"icmp", "tcp ", "tcp; drop"} {
		if _, ok := ParseProtocol(in); ok {
			t.Errorf("ParseProtocol(%q) accepted", in)
		}
	}
}

func TestPolicyDecisions(t *testing.T) {
	v4, _ := mustNet("192.0.2.2/24")
	v6, _ := mustNet("2001:db8::2/64")
	m := Mapping{HostPort: 8080, ContainerPort: 80, Protocol: TCP}
	for _, tt := range []struct {
		name            string
		f               Family
		n               *net.IPNet
		masq            Masquerade
		localNet, lhost bool
		target          string
	}{
		{"ipv4 snat", IPv4, v4, Masquerade{Enabled: true}, true, true, "192.0.2.2:80"},
		{"ipv4 masqAll", IPv4, v4, Masquerade{Enabled: true, All: true}, true, false, "192.0.2.2:80"},
		{"ipv4 snat off", IPv4, v4, Masquerade{}, false, false, "192.0.2.2:80"},
		{"ipv6", IPv6, v6, Masquerade{Enabled: true}, false, false, "[2001:db8::2]:80"},
	} {
		p := Build(Request{Mappings: MappingsOf(m), Masquerade: tt.masq}, tt.f, tt.n)
		if p.LocalNet() != tt.localNet || p.LocalhostRule() != tt.lhost || p.Target(m) != tt.target {
			t.Errorf("%s: LocalNet %v, LocalhostRule %v, Target %q; want %v, %v, %q",
				tt.name, p.LocalNet(), p.LocalhostRule(), p.Target(m), tt.localNet, tt.lhost, tt.target)
		}
	}
}

func mustNet(s string) (*net.IPNet, error) {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		return nil, err
	}
	n.IP = ip
	if v4 := ip.To4(); v4 != nil {
		n.IP = v4
	}
	return n, nil
}

// What the renderers ask of a plan: the mark, the hairpin source, the
// DNAT target, control characters, the runs of its mappings.
func TestPlanHelpers(t *testing.T) {
	n4, _ := mustNet("192.0.2.2/24")
	n6, _ := mustNet("2001:db8::2/64")
	p4 := &Plan{Family: IPv4, ContainerNet: n4, Masquerade: Masquerade{MarkBit: 13}}
	p6 := &Plan{Family: IPv6, ContainerNet: n6}
	if m := p4.Masquerade.Mark(); m != 0x2000 {
		t.Errorf("Mark() of bit 13 = %#x", m)
	}
	for _, tt := range []struct {
		p    *Plan
		all  bool
		want string
	}{{p4, false, "192.0.2.0/24"}, {p4, true, "0.0.0.0/0"}, {p6, false, "2001:db8::/64"}, {p6, true, "::/0"}} {
		tt.p.Masquerade.All = tt.all
		if got := tt.p.HairpinSource(); got != tt.want {
			t.Errorf("%s masqAll %v: HairpinSource() = %s, want %s", tt.p.Family, tt.all, got, tt.want)
		}
	}
	if got := p6.Target(Mapping{ContainerPort: 80}); got != "[2001:db8::2]:80" {
		t.Errorf("Target = %s", got)
	}
	for s, want := range map[string]bool{"ip saddr 192.0.2.0/24": false, "a\nb": true, "tab\there": true, "del\x7f": true, "ünïcode": false} {
		if HasControl(s) != want {
			t.Errorf("HasControl(%q) = %v", s, !want)
		}
	}
	p4.Mappings = MappingsOf(Run{HostPort: 8000, ContainerPort: 8000, Len: 3, Protocol: TCP}.Mappings()...)
	runs := p4.Runs()
	if len(runs) != 1 || !runs[0].Identity() || runs[0].Ports("-") != "8000-8002" {
		t.Errorf("Runs() = %+v", runs)
	}
	if (Run{HostPort: 80, ContainerPort: 8080, Len: 1}).Identity() {
		t.Error("80 → 8080 is an identity run")
	}
}

// Fingerprint tells apart what could send a host port elsewhere — the
// address, a port, a protocol, a host IP, the family — and nothing else.
func TestFingerprint(t *testing.T) {
	n, _ := mustNet("192.0.2.2/24")
	base := func() *Plan {
		return &Plan{Family: IPv4, ContainerNet: n, Localhost: LocalhostNAT,
			Mappings: MappingsOf(Mapping{HostPort: 8080, ContainerPort: 80, Protocol: TCP})}
	}
	fp := Fingerprint([]*Plan{base()})
	same := base()
	same.Localhost, same.Masquerade.MarkBit = LocalhostSocket, 20
	if Fingerprint([]*Plan{same}) != fp {
		t.Error("options the host resolves change the fingerprint")
	}
	other, _ := mustNet("192.0.2.3/24")
	first := func(change func(*Mapping)) func(*Plan) {
		return func(p *Plan) {
			ms := p.Mappings.Slice()
			change(&ms[0])
			p.Mappings = MappingsOf(ms...)
		}
	}
	for name, change := range map[string]func(*Plan){
		"address":        func(p *Plan) { p.ContainerNet = other },
		"host port":      first(func(m *Mapping) { m.HostPort = 8081 }),
		"container port": first(func(m *Mapping) { m.ContainerPort = 81 }),
		"protocol":       first(func(m *Mapping) { m.Protocol = UDP }),
		"host IP":        first(func(m *Mapping) { m.HostIP = net.ParseIP("198.51.100.1") }),
		"family":         func(p *Plan) { p.Family = IPv6 },
		"no address":     func(p *Plan) { p.ContainerNet = nil },
	} {
		p := base()
		change(p)
		if Fingerprint([]*Plan{p}) == fp {
			t.Errorf("a changed %s keeps the fingerprint", name)
		}
	}
	if Fingerprint(nil) == fp || len(fp) != 32 {
		t.Errorf("fingerprints %q and %q", fp, Fingerprint(nil))
	}
}

// TestRunsRemembered: a plan coalesces its mappings once; a copy given
// other mappings coalesces its own, and the original still has its runs.
func TestRunsRemembered(t *testing.T) {
	var ms []Mapping
	for i := range 100 {
		ms = append(ms, Mapping{HostPort: 20000 + i, ContainerPort: 20000 + i, Protocol: TCP})
	}
	p := Build(Request{Mappings: MappingsOf(ms...)}, IPv4, nil)
	a, b := p.Runs(), p.Runs()
	if len(a) != 1 || &a[0] != &b[0] {
		t.Fatalf("Runs twice: %v and %v, want one run computed once", a, b)
	}
	moved := *p
	changed := p.Mappings.Slice()
	changed[50].ContainerPort = 80
	moved.Mappings = MappingsOf(changed...)
	if got := moved.Runs(); len(got) != 3 {
		t.Errorf("a copy with other mappings: %+v, want 3 runs", got)
	}
	if got := p.Runs(); len(got) != 1 || got[0].Len != 100 {
		t.Errorf("the original after its copy: %+v, want its one run", got)
	}
	lit := &Plan{Mappings: MappingsOf(ms[:2]...)}
	if got := lit.Runs(); len(got) != 1 || got[0].Len != 2 {
		t.Errorf("a plan not built: %+v", got)
	}
}
