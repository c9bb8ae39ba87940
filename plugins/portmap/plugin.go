// Package portmap is the CNI plugin: its verbs load the attachment
// (pkg/attach: the configuration, the owner, a plan per IP family) and
// hand each plan to the stack of the selected backend and the layers the
// configuration turns on (pkg/backend). The node is reached only through
// a *host.Host, so the verbs are tested with a fake host and the kernel
// tests use the real one.
package portmap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/attach"
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
	decoded *attach.Config
	brief   []byte
}

// New returns the plugin wired to the real host; notes go to stderr.
func New() *Plugin {
	h := host.Real(os.Stderr)
	return &Plugin{Stdout: os.Stdout, Host: h, Inventory: inventory.OnHost{Host: h}}
}

// load is attach.Load of the verb's request, decoded once (serve.go).
func (p *Plugin) load(args *skel.CmdArgs) (*attach.Attachment, error) {
	c := p.decodedFor(args.StdinData)
	if c == nil {
		return attach.Load(p.Host, args.StdinData, args.ContainerID, args.IfName)
	}
	return attach.Of(p.Host, c, args.ContainerID, args.IfName), nil
}

// cniError gives an error its spec code at the boundary: lock timeouts
// (ours, and the xtables lock an iptables tool gave up on) are "try
// again later"; *types.Error passes through; the rest is skel's 999.
func cniError(a *attach.Attachment, err error) error {
	if err == nil {
		return nil
	}
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	var ce *plan.ConfigError
	if errors.As(err, &ce) {
		return types.NewError(types.ErrInvalidNetworkConfig, ce.Error(), "")
	}
	if errors.Is(err, lock.ErrTimeout) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s backend: %v", a.Backend, err), "")
	}
	// skel answers code 999 with the message; the chain stays for callers
	// that look (errors.Is/As).
	return fmt.Errorf("%s backend: %w", a.Backend, err)
}

// Inventory is what the "reject" policy reads of the host.
type Inventory interface {
	// Mappings returns the host ports mapped in family f, by both backends.
	Mappings(f plan.Family) ([]inventory.Entry, error)
	// Listener names a host socket that would receive (hostIP, port), or "".
	Listener(proto, hostIP string, port int) (string, error)
}

// decodedFor returns the configuration Serve decoded, if stdin is what it
// handed skel in the request's place.
func (p *Plugin) decodedFor(stdin []byte) *attach.Config {
	if p.decoded == nil || !bytes.Equal(stdin, p.brief) {
		return nil
	}
	c := p.decoded
	p.decoded, p.brief = nil, nil
	return c
}
