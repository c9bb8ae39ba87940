// Package backend is the one seam between the programs (the CNI plugin,
// the node agent, `portmap-agent list`) and the kernel state they keep: what a
// backend does for one IP family, the registry of backends and layers, and
// the stack a CNI verb drives.
//
//	     plugin verbs (ADD, CHECK, DEL, GC, STATUS)       agent (sync, list)
//	                    │                                      │
//	              Stack(base + layers)                 every Backend and Layer
//	                    │                                 of every family
//	    ┌───────────────┼──────────────┬──────────────┐        │
//	 iptables        nftables     forwardAccept    localhost
//	(nat DNAT)     (nat DNAT)   (filter FORWARD)  (cgroup socket hooks)
//
// A backend maps host ports (exactly one per attachment: the config's
// "backend"). A layer is a mechanism beside those rules that a
// configuration turns on for its attachments, whatever backend maps them;
// it implements the same interface, so the verbs never name it and the
// agent syncs it like a backend.
package backend

import (
	"fmt"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Verbs is what the CNI verbs ask of one family.
type Verbs interface {
	// Apply installs the plan, replacing whatever the attachment had.
	Apply(*plan.Plan) error
	// Remove deletes what the attachment owns; idempotent, and the plan may
	// lack the container's address and mappings (DEL without prevResult).
	Remove(*plan.Plan) error
	// Check names the first object of the plan that is missing or wrong.
	Check(*plan.Plan) error
	// GC removes network's attachments that are not in valid.
	GC(network string, valid []plan.Owner) error
	// Ready reports whether ADD of plans like p can be served.
	Ready(p *plan.Plan) error
}

// Backend is everything one backend (or layer) does for one family.
type Backend interface {
	Verbs
	// Sync brings the family's state to want (oldest first) for `portmap
	// sync`: one read and at most one write; the caller holds the host-wide
	// lock.
	Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error)
	// Mappings reads back the host ports the family's state forwards.
	Mappings() ([]plan.Installed, error)
}

// Retirer is a layer with node-wide objects that can go once no
// attachment uses them (the socket path's programs and pins): Retire
// removes them when nothing holds an entry and says what it removed ("":
// nothing, because something still does or nothing was there). The
// caller holds the host-wide lock.
type Retirer interface {
	Retire() (string, error)
}

// Skeletal is a backend (or layer) whose shared objects — what every
// attachment's objects hang on, that a firewall flush takes away — can be
// checked alone, without reading any attachment's: STATUS asks it.
type Skeletal interface {
	// Skeleton names the first shared object that ADD of plans like p
	// makes and that is missing, or ""; some says that some of them
	// exist (all, when nothing is missing): the family was set up since
	// its firewall was last emptied. A family with none while another has
	// some was never set up (a node with IPv4 host ports only) — or lost
	// to a removal of that family's table alone, which STATUS takes for
	// the same.
	Skeleton(p *plan.Plan) (missing string, some bool, err error)
}

// opened turns a typed constructor's answer into a Backend that names
// its family in every error (the one place that prefix is added), without
// keeping a typed nil inside a non-nil interface.
func opened[B Backend](f plan.Family, b B, err error) (Backend, error) {
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f, err)
	}
	return inFamily{b, f}, nil
}

// inFamily prefixes b's errors with its family: "ipv6: missing chain …".
type inFamily struct {
	b Backend
	f plan.Family
}

func (x inFamily) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", x.f, err)
}

func (x inFamily) Apply(p *plan.Plan) error  { return x.wrap(x.b.Apply(p)) }
func (x inFamily) Remove(p *plan.Plan) error { return x.wrap(x.b.Remove(p)) }
func (x inFamily) Check(p *plan.Plan) error  { return x.wrap(x.b.Check(p)) }
func (x inFamily) Ready(p *plan.Plan) error  { return x.wrap(x.b.Ready(p)) }
func (x inFamily) GC(network string, valid []plan.Owner) error {
	return x.wrap(x.b.GC(network, valid))
}
func (x inFamily) Mappings() ([]plan.Installed, error) {
	ms, err := x.b.Mappings()
	return ms, x.wrap(err)
}
func (x inFamily) Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error) {
	r, err := x.b.Sync(want, o)
	return r, x.wrap(err)
}

// Retire forwards to a backend that is a Retirer; the others have nothing
// to retire.
func (x inFamily) Retire() (string, error) {
	if r, ok := x.b.(Retirer); ok {
		what, err := r.Retire()
		return what, x.wrap(err)
	}
	return "", nil
}

// Skeleton forwards to a backend that is Skeletal; the others have no
// shared objects to check.
func (x inFamily) Skeleton(p *plan.Plan) (string, bool, error) {
	if sk, ok := x.b.(Skeletal); ok {
		missing, some, err := sk.Skeleton(p)
		return missing, some, x.wrap(err)
	}
	return "", false, nil
}
