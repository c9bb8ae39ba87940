// Package portmap is the CNI plugin: it parses the configuration, builds a
// plan per IP family, and hands each plan to the stack of the selected
// backend and the layers the configuration turns on (pkg/backend). The
// node is reached only through a *host.Host, so the verbs are tested with
// a fake host and the kernel tests use the real one.
package portmap

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Plugin holds the verbs and what they need.
type Plugin struct {
	Stdout io.Writer
	Host   *host.Host
	// Inventory reads the host's mappings and sockets for the "reject"
	// conflict policy.
	Inventory Inventory

	// decoded is the request Serve decoded, and brief what it handed skel
	// in its place (serve.go).
	decoded *Config
	brief   []byte
}

// New returns the plugin wired to the real host; notes go to stderr.
func New() *Plugin {
	h := host.Real(os.Stderr)
	return &Plugin{Stdout: os.Stdout, Host: h, Inventory: inventory.OnHost{Host: h}}
}

// Funcs are the verbs for skel.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status}
}

// parse is ParseConfig with the host's default backend.
func (p *Plugin) parse(args *skel.CmdArgs) (*Config, error) {
	c := p.decodedFor(args.StdinData)
	if c == nil {
		var err error
		if c, err = ParseConfig(args.StdinData, args.IfName, p.Host.DefaultBackend()); err != nil {
			return nil, err
		}
	}
	p.Host.Resolve(&c.Request)
	return c, nil
}

// Owner is the attachment a configuration's verb acts for.
func (c *Config) Owner(containerID, ifName string) plan.Owner {
	return plan.Owner{Network: c.Network, ContainerID: containerID, IfName: ifName}
}

// Plans are the attachment's non-empty plans, one per family the
// container has an address of.
func (c *Config) Plans() []*plan.Plan {
	var out []*plan.Plan
	for _, f := range plan.Families {
		if n := c.ContainerNets[f]; n != nil {
			if pl := plan.Build(c.Request, f, n); !pl.Empty() {
				out = append(out, pl)
			}
		}
	}
	return out
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
