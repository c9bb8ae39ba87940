package host_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/host"
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

// One walk of the table for every UDP and SCTP host port of the plans,
// each port with the address it names (a hostIP; an unspecified one is
// every address of the node), TCP left out.
func TestFlushOnceAWalkOnlyUDPAndSCTP(t *testing.T) {
	h, fh := fakehost.New()
	_, n, _ := net.ParseCIDR("192.0.2.2/24")
	ms := []plan.Mapping{
		{HostPort: 53, ContainerPort: 53, Protocol: plan.UDP},
		{HostPort: 53, ContainerPort: 53, Protocol: plan.UDP, HostIP: net.ParseIP("198.51.100.1")},
		{HostPort: 80, ContainerPort: 80, Protocol: plan.TCP},
		{HostPort: 9, ContainerPort: 9, Protocol: plan.SCTP},
		{HostPort: 9, ContainerPort: 9, Protocol: plan.SCTP, HostIP: net.IPv4zero},
	}
	req := plan.Request{Mappings: plan.MappingsOf(ms...)}
	h.Flush(plan.Build(req, plan.IPv4, n), plan.Build(req, plan.IPv4, n))
	if got, want := fh.Calls(), "flush ipv4 sctp 9\nflush ipv4 udp 53\nflush ipv4 udp 53 at 198.51.100.1\nflushed"; got != want {
		t.Errorf("calls:\n%s\nwant:\n%s", got, want)
	}
	h.Flush(plan.Build(plan.Request{Mappings: plan.MappingsOf(ms[2:3]...)}, plan.IPv4, n))
	if got := fh.Calls(); got != "flush ipv4 sctp 9\nflush ipv4 udp 53\nflush ipv4 udp 53 at 198.51.100.1\nflushed" {
		t.Errorf("a TCP-only flush walked the table: %s", got)
	}
}

// "localhost": "auto" becomes the socket path where the host can serve
// it at the request's site, else NAT; other values stay as they are.
func TestResolve(t *testing.T) {
	for _, tt := range []struct {
		in    plan.Localhost
		ready error
		nilFn bool
		want  plan.Localhost
	}{
		{plan.LocalhostAuto, nil, false, plan.LocalhostSocket},
		{plan.LocalhostAuto, errors.New("no cgroup2"), false, plan.LocalhostNAT},
		{plan.LocalhostAuto, nil, true, plan.LocalhostNAT},
		{plan.LocalhostNAT, nil, false, plan.LocalhostNAT},
		{plan.LocalhostSocket, errors.New("no cgroup2"), false, plan.LocalhostSocket},
	} {
		h, _ := fakehost.New()
		var asked *plan.Request
		h.SocketReady = func(r *plan.Request) error { asked = r; return tt.ready }
		if tt.nilFn {
			h.SocketReady = nil
		}
		req := &plan.Request{Localhost: tt.in, Socket: plan.Socket{PinDir: "/run/pins"}}
		h.Resolve(req)
		if req.Localhost != tt.want || (asked != nil && asked != req) {
			t.Errorf("%s with ready %v: %s, want %s", tt.in, tt.ready, req.Localhost, tt.want)
		}
	}
}

// The real host's handle: the registry's rows, the socket path's site
// check from the registry, a default backend.
func TestReal(t *testing.T) {
	h := host.Real(io.Discard)
	if len(h.Kinds) != len(backend.Kinds) || len(h.Layers) != len(backend.Layers) || h.SocketReady == nil || h.Ledger == nil {
		t.Fatalf("Real: %+v", h)
	}
	if d := h.DefaultBackend(); d != backend.IPTables && d != backend.NFTables {
		t.Errorf("default backend %q", d)
	}
	t.Setenv("PATH", t.TempDir()) // no iptables
	_, err := h.Open(backend.IPTables, plan.IPv4)
	if !host.NotInstalled(err) || !strings.Contains(err.Error(), "iptables-restore") {
		t.Errorf("opening iptables without its tools: %v, want it not installed, naming the tool", err)
	}
	// nft missing for conditions is an error of its own, not a backend
	// that cannot exist here; nor is anything else
	for _, err := range []error{fmt.Errorf("conditionsV4/V6 are nft syntax, compiled by nft: %w", exec.ErrNotFound), errors.New("permission denied")} {
		if host.NotInstalled(err) {
			t.Errorf("NotInstalled(%v)", err)
		}
	}
}
