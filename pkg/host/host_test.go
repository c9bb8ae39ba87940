package host_test

import (
	"net"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
)

func TestStackTakesTheLayersTheRequestTurnsOn(t *testing.T) {
	h, fh := fakehost.New()
	s, err := h.Stack("nftables", plan.IPv4, &plan.Request{})
	if err != nil || len(s.Layers) != 0 {
		t.Fatalf("no forwardAccept: %d layers, %v", len(s.Layers), err)
	}
	s, err = h.Stack("nftables", plan.IPv6, &plan.Request{ForwardAccept: true})
	if err != nil || len(s.Layers) != 1 {
		t.Fatalf("forwardAccept: %d layers, %v", len(s.Layers), err)
	}
	if got, want := fh.Calls(), "backend nftables ipv4\nbackend nftables ipv6\nlayer forwardAccept ipv6"; got != want {
		t.Errorf("calls:\n%s\nwant:\n%s", got, want)
	}
	if _, err := h.Stack("ipvs", plan.IPv4, &plan.Request{}); err == nil {
		t.Error("an unknown backend opened")
	}
}

func TestFlushOnceAWalkOnlyUDPAndSCTP(t *testing.T) {
	h, fh := fakehost.New()
	_, n, _ := net.ParseCIDR("192.0.2.2/24")
	req := plan.Request{Mappings: []plan.Mapping{
		{HostPort: 53, ContainerPort: 53, Protocol: plan.UDP},
		{HostPort: 53, ContainerPort: 53, Protocol: plan.UDP, HostIP: net.ParseIP("198.51.100.1")},
		{HostPort: 80, ContainerPort: 80, Protocol: plan.TCP},
		{HostPort: 9, ContainerPort: 9, Protocol: plan.SCTP},
	}}
	h.Flush(plan.Build(req, plan.IPv4, n), plan.Build(req, plan.IPv4, n))
	if got, want := fh.Calls(), "flush ipv4 sctp 9\nflush ipv4 udp 53\nflushed"; got != want {
		t.Errorf("calls:\n%s\nwant:\n%s", got, want)
	}
	h.Flush(plan.Build(plan.Request{Mappings: req.Mappings[2:3]}, plan.IPv4, n))
	if got := fh.Calls(); got != "flush ipv4 sctp 9\nflush ipv4 udp 53\nflushed" {
		t.Errorf("a TCP-only flush walked the table: %s", got)
	}
}
