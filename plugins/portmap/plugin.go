// Package portmap is the CNI plugin: it parses the configuration, builds a
// plan per IP family, and hands it to the selected backend. Everything it
// touches outside the process is behind a small interface, so the verbs are
// tested with fakes and the kernel tests use the real thing.
package portmap

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/conntrack"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/sysctl"
)

// Backend applies, removes and checks the plan of one family.
type Backend interface {
	Apply(*plan.Plan) error
	Remove(*plan.Plan) error
	Check(*plan.Plan) error
	// GC removes network's attachments that are not in valid.
	GC(network string, valid []plan.Owner) error
	// Ready reports whether the backend can serve ADD of plans like p.
	Ready(p *plan.Plan) error
}

// Forwarder keeps the forwardAccept rules of one family (in iptables'
// filter FORWARD, whichever backend maps the ports).
type Forwarder interface {
	Apply(*plan.Plan) error
	Remove(*plan.Plan) error
	Check(*plan.Plan) error
	GC(network string, valid []plan.Owner) error
	Syncer
}

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

// Plugin holds the verbs and what they need.
type Plugin struct {
	Stdout io.Writer
	Stderr io.Writer
	// NewBackend returns the backend called name for family f.
	NewBackend func(name BackendName, f plan.Family) (Backend, error)
	// NewForward returns the forwardAccept rules of family f; an error
	// wrapping exec.ErrNotFound means the host has no iptables, so no
	// FORWARD chain of it can drop anything.
	NewForward func(f plan.Family) (Forwarder, error)
	// DefaultBackend names the backend used when the config has none.
	DefaultBackend func() BackendName
	Sysctl         Sysctl
	Conntrack      Conntrack
	// Inventory reads the host's mappings and sockets for the "reject"
	// conflict policy.
	Inventory Inventory
	// Lock takes the host-wide lock (`portmap sync` holds it for a pass).
	Lock func() (release func(), err error)
}

// LockTimeout bounds the wait for the host-wide lock.
const LockTimeout = 30 * time.Second

// New returns the plugin wired to the real host.
func New() *Plugin {
	p := &Plugin{
		Stdout:         os.Stdout,
		Stderr:         os.Stderr,
		DefaultBackend: defaultBackend,
		Sysctl:         sysctl.Host{},
		Conntrack:      conntrack.Host{},
		Inventory:      hostInventory{},
		Lock:           func() (func(), error) { return lock.Acquire(lock.DefaultPath, LockTimeout) },
	}
	p.NewBackend = func(name BackendName, f plan.Family) (Backend, error) { return newBackend(name, f, p.Stderr) }
	p.NewForward = func(f plan.Family) (Forwarder, error) {
		fw, err := iptables.NewForward(f)
		if err != nil {
			return nil, err
		}
		return fw, nil
	}
	return p
}

// Funcs are the verbs for skel.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status}
}

func newBackend(name BackendName, f plan.Family, log io.Writer) (Backend, error) {
	switch name {
	case BackendIPTables:
		b, err := iptables.New(f)
		if err != nil {
			return nil, err
		}
		return b, nil
	case BackendNFTables:
		b, err := nftables.New(f, log)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("unknown backend %q", name)
}

// defaultBackend is upstream's choice when "backend" is absent: iptables
// if its tools are there, else nftables — which talks to the kernel over
// netlink and needs no nft binary. It looks at PATH only, so the choice
// costs no process.
func defaultBackend() BackendName {
	if _, err := exec.LookPath(iptables.RestoreCommand(plan.IPv4)); err == nil {
		return BackendIPTables
	}
	return BackendNFTables
}

func owner(c *Config, args *skel.CmdArgs) plan.Owner {
	return plan.Owner{Network: c.Network, ContainerID: args.ContainerID, IfName: args.IfName}
}

// cniError gives an error its spec code at the boundary: lock timeouts are
// "try again later"; *types.Error passes through; the rest is skel's 999.
func cniError(c *Config, err error) error {
	if err == nil {
		return nil
	}
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	if errors.Is(err, lock.ErrTimeout) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s backend: %v", c.Backend, err), "")
	}
	// skel answers code 999 with the message; the chain stays for callers
	// that look (errors.Is/As).
	return fmt.Errorf("%s backend: %w", c.Backend, err)
}

// forwarder returns family f's forwardAccept rules, or nil when the host
// has no iptables (then nothing of iptables can drop forwarded traffic).
func (p *Plugin) forwarder(f plan.Family) (Forwarder, error) {
	fw, err := p.NewForward(f)
	if errors.Is(err, exec.ErrNotFound) {
		return nil, nil
	}
	return fw, err
}

// flush removes stale UDP/SCTP conntrack entries of the plans' host
// ports, both families in one walk of the table. Failures are reported,
// not fatal: the rules are right either way.
func (p *Plugin) flush(pls ...*plan.Plan) {
	var ports []conntrack.Port
	seen := map[conntrack.Port]bool{}
	for _, pl := range pls {
		for _, pp := range pl.HostPorts() {
			cp := conntrack.Port{Family: pl.Family, Protocol: pp.Protocol, Port: pp.Port}
			if conntrack.NeedsFlush(pp.Protocol) && !seen[cp] {
				seen[cp] = true
				ports = append(ports, cp)
			}
		}
	}
	if len(ports) == 0 {
		return
	}
	if err := p.Conntrack.FlushDstPorts(ports); err != nil {
		fmt.Fprintf(p.Stderr, "portmap: %v\n", err)
	}
}
