// Package attach turns a CNI request into the attachment every verb and
// the node agent drive: Parse validates the configuration (pure: the
// same bytes give the same Config on every node), and Load adds what the
// node decides — the default backend, "localhost": "auto" resolved — the
// owner, and the plans of each family the container has an address of.
//
//	stdin ──Parse──► Config ──Of(node, owner)──► Attachment{Config, Plans}
//
// The CNI plugin (plugins/portmap) and the agent (pkg/agent) both call
// Load, so that a sync pass rebuilds exactly what ADD made.
package attach

import (
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Attachment is one container's attachment as a verb drives it.
type Attachment struct {
	*Config
	// Plans are its non-empty plans, one per family the container has
	// an address of (none without prevResult or mappings).
	Plans []*plan.Plan
	// Auto is true where the configuration said "localhost": "auto",
	// which Request.Localhost holds resolved on this node.
	Auto bool
}

// Load parses stdin for the attachment of containerID on ifName and
// finishes it for node h (Of). Every error is Parse's *types.Error.
func Load(h *host.Host, stdin []byte, containerID, ifName string) (*Attachment, error) {
	c, err := Parse(stdin, ifName, h.DefaultBackend())
	if err != nil {
		return nil, err
	}
	return Of(h, c, containerID, ifName), nil
}

// Of finishes a parsed configuration c for node h: "localhost": "auto"
// becomes what h serves, the owner is set, and the plans are built. c
// becomes the attachment's: it is not to be finished twice.
func Of(h *host.Host, c *Config, containerID, ifName string) *Attachment {
	auto := c.Request.Localhost == plan.LocalhostAuto
	h.Resolve(&c.Request)
	c.Request.Owner = plan.Owner{Network: c.Network, ContainerID: containerID, IfName: ifName}
	return build(c, auto)
}

// ResolvedAs is the attachment with "auto" resolved to mode, as its ADD
// resolved it on a node that may have seen otherwise than this process
// (the agent, in another mount namespace): a copy with its plans rebuilt,
// or a itself where the configuration did not say "auto" or mode is
// what a holds.
func (a *Attachment) ResolvedAs(mode plan.Localhost) *Attachment {
	if !a.Auto || mode == a.Request.Localhost || (mode != plan.LocalhostNAT && mode != plan.LocalhostSocket) {
		return a
	}
	c := *a.Config
	c.Request.Localhost = mode
	return build(&c, true)
}

func build(c *Config, auto bool) *Attachment {
	a := &Attachment{Config: c, Auto: auto}
	for _, f := range plan.Families {
		if n := c.ContainerNets[f]; n != nil {
			if pl := plan.Build(c.Request, f, n); !pl.Empty() {
				a.Plans = append(a.Plans, pl)
			}
		}
	}
	return a
}

// Plan is the attachment's plan of family f: the one Load built, or an
// empty one (DEL removes by owner what a family holds without it).
func (a *Attachment) Plan(f plan.Family) *plan.Plan {
	for _, pl := range a.Plans {
		if pl.Family == f {
			return pl
		}
	}
	return plan.Build(a.Request, f, a.ContainerNets[f])
}
