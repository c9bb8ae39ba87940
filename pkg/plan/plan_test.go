package plan

import (
	"net"
	"strings"
	"testing"
)

func TestBuildFiltersByFamily(t *testing.T) {
	req := Request{
		Owner: Owner{Network: "net1", ContainerID: "c1", IfName: "eth0"},
		Mappings: []Mapping{
			{HostPort: 80, ContainerPort: 8080, Protocol: TCP},
			{HostIP: net.ParseIP("198.51.100.1").To4(), HostPort: 53, ContainerPort: 53, Protocol: UDP},
			{HostIP: net.ParseIP("2001:db8::1"), HostPort: 54, ContainerPort: 54, Protocol: UDP},
			{HostIP: net.ParseIP("0.0.0.0").To4(), HostPort: 81, ContainerPort: 81, Protocol: TCP},
			{HostIP: net.ParseIP("::"), HostPort: 82, ContainerPort: 82, Protocol: SCTP},
			{HostPort: 80, ContainerPort: 8080, Protocol: TCP}, // exact duplicate
		},
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
			for _, m := range p.Mappings {
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
	req := Request{Mappings: []Mapping{{HostIP: net.ParseIP("::1"), HostPort: 80, ContainerPort: 80, Protocol: TCP}}}
	if p := Build(req, IPv4, nil); !p.Empty() {
		t.Errorf("IPv4 plan of an IPv6-only mapping has %v", p.Mappings)
	}
}

func TestPortsAndHostPorts(t *testing.T) {
	p := &Plan{Mappings: []Mapping{
		{HostPort: 90, Protocol: UDP},
		{HostPort: 80, Protocol: TCP},
		{HostIP: net.ParseIP("192.0.2.1"), HostPort: 80, Protocol: TCP},
		{HostPort: 70, Protocol: TCP},
	}}
	byProto := p.PortsByProtocol()
	if got := byProto[TCP]; len(got) != 2 || got[0] != 80 || got[1] != 70 {
		t.Errorf("tcp ports %v, want [80 70]", got)
	}
	hp := p.HostPorts()
	if len(hp) != 3 || hp[0] != (ProtoPort{TCP, 70}) || hp[2] != (ProtoPort{UDP, 90}) {
		t.Errorf("host ports %v", hp)
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
