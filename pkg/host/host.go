// Package host is the one handle on the node that the CNI plugin, the node
// agent and `portmap-agent list` are given: which backends and layers it can
// open, its route_localnet switch, its conntrack table, the host-wide lock.
// Real returns it wired to this host; tests build one from fakes.
package host

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sort"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/conntrack"
	"github.com/portmap-dev/portmap/pkg/firewalld"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/sysctl"
)

// Sysctl is the host's route_localnet switch.
type Sysctl interface {
	HostInterface(ip net.IP) (string, error)
	// HostInterfaces is HostInterface for many addresses at once.
	HostInterfaces(ips []net.IP) ([]string, error)
	EnableRouteLocalnet(ifName string) error
	RouteLocalnet(ifName string) (bool, error)
}

// Conntrack flushes stale flows of host ports.
type Conntrack interface {
	// FlushDstPorts flushes the flows to any of ports, in one walk of the
	// table.
	FlushDstPorts(ports []conntrack.Port) error
}

// Host is the node as the programs see it.
type Host struct {
	// Kinds and Layers are the backends and layers this host can open
	// (backend.Kinds and backend.Layers on the real host).
	Kinds  []backend.Kind
	Layers []backend.Layer
	// DefaultBackend names the backend used when a config has none.
	DefaultBackend func() backend.Name
	Sysctl         Sysctl
	Conntrack      Conntrack
	// Lock takes the host-wide lock.
	Lock func() (release func(), err error)
	// Ledger keeps what the plugin last began for each attachment
	// (pkg/ledger): written by ADD and DEL, read by the agent, all under
	// the lock.
	Ledger ledger.Ledger
	// Log receives notes the kernel state is worth (port takeovers,
	// failed flushes).
	Log io.Writer
	// SocketReady says what the host lacks to serve the socket path at
	// req's site (the "localhost" layer's SiteReady on the real host);
	// "localhost": "auto" uses it where it says nothing.
	SocketReady func(req *plan.Request) error
	// StrictForwardPorts says whether the node's firewall manager drops
	// DNATed connections it did not configure itself (firewalld's
	// StrictForwardPorts, firewalld.StrictForwardPorts on the real host),
	// and a note for the log when the answer came another way than asked
	// (the bus did not answer in time); nil: none to ask.
	StrictForwardPorts func() (strict bool, note string, err error)

	mu     sync.Mutex
	opened map[openKey]backend.Backend
}

// openKey names one backend or layer of one family.
type openKey struct {
	name string
	f    plan.Family
}

// cached returns what open returns for key, opening it once for the life
// of h: a backend holds a netlink socket, so a long-lived user (the
// agent's passes, a process driving many verbs) keeps one per backend and
// family instead of one per call. Failures are not kept: the tools may be
// installed later.
func (h *Host) cached(key openKey, open func(plan.Family, io.Writer) (backend.Backend, error)) (backend.Backend, error) {
	return h.cachedAt(key, func(f plan.Family, log io.Writer, _ *plan.Request) (backend.Backend, error) { return open(f, log) }, nil)
}

func (h *Host) cachedAt(key openKey, open func(plan.Family, io.Writer, *plan.Request) (backend.Backend, error), req *plan.Request) (backend.Backend, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b, ok := h.opened[key]; ok {
		return b, nil
	}
	b, err := open(key.f, h.Log, req)
	if err != nil {
		return nil, err
	}
	if h.opened == nil {
		h.opened = map[openKey]backend.Backend{}
	}
	h.opened[key] = b
	return b, nil
}

// Real returns the handle on this host; log receives its notes. Route
// and link lookups through vishvananda/netlink answer within
// nfnl.ReadTimeout, as the process's own netlink reads do (the library
// waits 60 s by default).
func Real(log io.Writer) *Host {
	_ = netlink.SetSocketTimeout(nfnl.ReadTimeout)
	return &Host{
		Kinds:          backend.Kinds,
		Layers:         backend.Layers,
		DefaultBackend: func() backend.Name { return backend.Default(backend.Kinds) },
		Sysctl:         sysctl.Host{},
		Conntrack:      conntrack.Host{},
		Lock:           lock.Host,
		Ledger:         &ledger.Dir{},
		Log:            log,
		SocketReady:    socketReady(),
		// the plugin asks it for ADD with host ports only
		StrictForwardPorts: firewalld.StrictForwardPorts,
	}
}

// socketReady is the socket path's SiteReady, from the registry.
func socketReady() func(*plan.Request) error {
	l, _ := backend.LayerNamed(SocketLayer)
	return l.SiteReady
}

// SocketLayer is the registry's name of the socket path: the layer
// "localhost": "auto" resolves to where the host can serve it.
const SocketLayer = "localhost"

// Resolve turns "localhost": "auto" into what this host serves: the
// socket path where it can, else NAT. Every verb and the agent resolve
// before they plan, so they plan alike.
func (h *Host) Resolve(req *plan.Request) {
	if req.Localhost != plan.LocalhostAuto {
		return
	}
	req.Localhost = plan.LocalhostNAT
	if h.SocketReady != nil && h.SocketReady(req) == nil {
		req.Localhost = plan.LocalhostSocket
	}
}

// Open returns the backend called name for family f.
func (h *Host) Open(name backend.Name, f plan.Family) (backend.Backend, error) {
	for _, k := range h.Kinds {
		if k.Name == name {
			return h.cached(openKey{"backend " + string(name), f}, k.Open)
		}
	}
	return nil, fmt.Errorf("unknown backend %q", name)
}

// OpenLayer returns layer l of family f at the site req uses (nil: the
// default site), opened once for the life of h.
func (h *Host) OpenLayer(l backend.Layer, f plan.Family, req *plan.Request) (backend.Backend, error) {
	return h.cachedAt(openKey{"layer " + l.Name + "\x00" + l.SiteOf(req), f}, l.Open, req)
}

// Stack returns what a CNI verb of a request drives in family f: the
// backend called name and the layers req turns on. An error wrapping
// backend.ErrNotInstalled says the backend's tools are not installed.
func (h *Host) Stack(name backend.Name, f plan.Family, req *plan.Request) (backend.Stack, error) {
	base, err := h.Open(name, f)
	if err != nil {
		return backend.Stack{}, err
	}
	s := backend.Stack{Base: base}
	for _, l := range h.Layers {
		if !l.Wants(req) {
			continue
		}
		lb, err := h.OpenLayer(l, f, req)
		if err != nil {
			return backend.Stack{}, fmt.Errorf("%s: %w", l.Name, err)
		}
		s.Layers = append(s.Layers, lb)
		if l.ReadyFirst {
			s.ReadyFirst = append(s.ReadyFirst, lb)
		}
	}
	return s, nil
}

// Flush removes the UDP/SCTP conntrack entries of the plans' host ports
// that the plans' rules, just written, translate otherwise (conntrack.Port:
// a flow whose reply does not come from the container), both families in
// one walk of the table. Failures go to the log, not to the caller: the
// rules are right either way.
func (h *Host) Flush(pls ...*plan.Plan) { h.flush(false, pls) }

// FlushRemoved removes the UDP/SCTP conntrack entries of the plans' host
// ports whose replies come from the plans' container, whose rules are
// gone (DEL): a newer attachment's flows on the port stay.
func (h *Host) FlushRemoved(pls ...*plan.Plan) { h.flush(true, pls) }

func (h *Host) flush(gone bool, pls []*plan.Plan) {
	var ports []conntrack.Port
	seen := map[conntrack.Port]bool{}
	for _, pl := range pls {
		var ip netip.Addr
		if pl.ContainerNet != nil {
			ip, _ = netip.AddrFromSlice(pl.ContainerNet.IP)
			ip = ip.Unmap()
		}
		for _, r := range pl.Runs() {
			if !conntrack.NeedsFlush(r.Protocol) {
				continue // a TCP range: nothing of it is read
			}
			for port := r.HostPort; port <= r.Last(); port++ {
				cp := conntrack.Port{Family: pl.Family, Protocol: r.Protocol, Port: port, Addr: hostAddr(r.HostIP), Gone: gone}
				if ip.IsValid() {
					cp.To = netip.AddrPortFrom(ip, uint16(r.ContainerPortOf(port)))
				}
				if !seen[cp] {
					seen[cp] = true
					ports = append(ports, cp)
				}
			}
		}
	}
	if len(ports) == 0 {
		return
	}
	sort.Slice(ports, func(i, j int) bool {
		a, b := ports[i], ports[j]
		return cmp.Or(cmp.Compare(a.Family, b.Family), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port), a.Addr.Compare(b.Addr)) < 0
	})
	if err := h.Conntrack.FlushDstPorts(ports); err != nil {
		fmt.Fprintf(h.Log, "portmap: %v\n", err)
	}
}

// hostAddr is a mapping's hostIP as conntrack matches it: the zero Addr
// for every address of the node (no hostIP, or an unspecified one).
func hostAddr(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip)
	if !ok || a.Unmap().IsUnspecified() {
		return netip.Addr{}
	}
	return a.Unmap()
}

// NotInstalled reports whether err says a backend's tools are missing
// (then nothing of it can exist on this host).
func NotInstalled(err error) bool { return errors.Is(err, backend.ErrNotInstalled) }
