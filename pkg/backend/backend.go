// Package backend is the one seam between the programs (the CNI plugin,
// the node agent, `portmap list`) and the kernel state they keep: what a
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
	"errors"
	"fmt"
	"io"
	"os/exec"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/backend/socket"
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

// Name is a value of the "backend" key.
type Name string

// The backends.
const (
	IPTables Name = "iptables"
	NFTables Name = "nftables"
)

// Kind is one backend of the registry.
type Kind struct {
	Name Name
	// Open returns the backend of family f on the real kernel; an error
	// wrapping exec.ErrNotFound means its tools are not installed, so
	// nothing of it can exist on this host.
	Open func(f plan.Family, log io.Writer) (Backend, error)
	// BadConditionToken says why tok cannot be one token of
	// conditionsV4/V6 in this backend's syntax, or "".
	BadConditionToken func(tok string) string
}

// Kinds is the registry of backends, in the order the agent syncs them.
var Kinds = []Kind{
	{IPTables, openIPTables, iptables.BadConditionToken},
	{NFTables, openNFTables, nftables.BadConditionToken},
}

func openIPTables(f plan.Family, _ io.Writer) (Backend, error) {
	b, err := iptables.New(f)
	return opened(f, b, err)
}

func openNFTables(f plan.Family, log io.Writer) (Backend, error) {
	b, err := nftables.New(f, log)
	return opened(f, b, err)
}

// Lookup returns the registered backend called name.
func Lookup(name Name) (Kind, bool) {
	for _, k := range Kinds {
		if k.Name == name {
			return k, true
		}
	}
	return Kind{}, false
}

// Layer is a mechanism beside the backends' DNAT rules that a
// configuration turns on for its attachments (forwardAccept, and the
// socket path as "localhost").
type Layer struct {
	// Name is the configuration key that turns it on; reports use it.
	Name string
	// Wants reports whether attachments of req use the layer.
	Wants func(req *plan.Request) bool
	// Site names the instance of the layer that req's attachments use,
	// for a layer whose configuration places it (the socket path's cgroup
	// and pin directory); nil for a layer with one instance.
	Site func(req *plan.Request) string
	// ReadyFirst makes ADD ask the layer's Ready before anything is
	// written, so that a host that cannot serve it fails ADD with nothing
	// changed (a cheap Ready: no process).
	ReadyFirst bool
	// Open returns the layer of family f on the real kernel, at req's
	// site (req is nil for the default site).
	Open func(f plan.Family, log io.Writer, req *plan.Request) (Backend, error)
}

// SiteOf is the instance of l that req uses ("" for the default one).
func (l Layer) SiteOf(req *plan.Request) string {
	if l.Site == nil || req == nil {
		return ""
	}
	return l.Site(req)
}

// Layers is the registry of layers, in the order a stack applies them.
var Layers = []Layer{
	{Name: "forwardAccept", Wants: func(r *plan.Request) bool { return r.ForwardAccept }, Open: openAccept},
	{Name: "localhost", Wants: func(r *plan.Request) bool { return r.Localhost == plan.LocalhostSocket },
		Site: socketSite, ReadyFirst: true, Open: openSocket},
}

// socketSite names the socket path's instance by its pin directory ("":
// the default one), which holds its maps and links; the cgroup is where
// those links attach, one per pin directory.
func socketSite(r *plan.Request) string { return r.Socket.PinDir }

// openSocket returns the socket path of family f at req's site.
func openSocket(f plan.Family, _ io.Writer, req *plan.Request) (Backend, error) {
	var cfg plan.Socket
	if req != nil {
		cfg = req.Socket
	}
	l, err := socket.New(f, cfg)
	return opened(f, l, err)
}

// openAccept returns forwardAccept's rules, which live in iptables'
// filter FORWARD whichever backend maps the ports. A host without
// iptables has no FORWARD chain of it that could drop anything: the layer
// is then Nothing.
func openAccept(f plan.Family, _ io.Writer, _ *plan.Request) (Backend, error) {
	a, err := iptables.NewAccept(f)
	if errors.Is(err, exec.ErrNotFound) {
		return Nothing{}, nil
	}
	return opened(f, a, err)
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

// Nothing is a layer with nothing to do on this host.
type Nothing struct{}

func (Nothing) Apply(*plan.Plan) error              { return nil }
func (Nothing) Remove(*plan.Plan) error             { return nil }
func (Nothing) Check(*plan.Plan) error              { return nil }
func (Nothing) GC(string, []plan.Owner) error       { return nil }
func (Nothing) Ready(*plan.Plan) error              { return nil }
func (Nothing) Mappings() ([]plan.Installed, error) { return nil, nil }
func (Nothing) Sync(want []*plan.Plan, _ converge.Options) (*converge.Report, error) {
	return converge.NewReport(len(want)), nil
}

// Stack is what one CNI verb drives in one family: the configured backend
// and the layers the configuration turned on, as one Verbs.
type Stack struct {
	Base   Backend
	Layers []Backend
	// ReadyFirst are the layers ADD asks before it writes.
	ReadyFirst []Backend
}

var _ Verbs = Stack{}

// Apply applies the backend, then each layer; when one fails, what this
// call applied is removed again.
func (s Stack) Apply(p *plan.Plan) error {
	if err := s.Base.Apply(p); err != nil {
		return err
	}
	for i, l := range s.Layers {
		if err := l.Apply(p); err != nil {
			errs := []error{err}
			for _, done := range append(s.Layers[:i:i], s.Base) {
				if uerr := done.Remove(p); uerr != nil {
					errs = append(errs, fmt.Errorf("undo: %w", uerr))
				}
			}
			return errors.Join(errs...)
		}
	}
	return nil
}

// Remove removes the layers' objects, then the backend's; it goes on
// after an error and returns them all.
func (s Stack) Remove(p *plan.Plan) error {
	var errs []error
	for _, l := range s.Layers {
		errs = append(errs, l.Remove(p))
	}
	return errors.Join(append(errs, s.Base.Remove(p))...)
}

// Check checks the backend, then each layer.
func (s Stack) Check(p *plan.Plan) error {
	return s.each(func(b Backend) error { return b.Check(p) })
}

// LayersReady asks the ReadyFirst layers whether they can serve p: ADD
// asks before it changes anything, so a host that cannot serve such a
// layer fails ADD with nothing written.
func (s Stack) LayersReady(p *plan.Plan) error {
	for _, l := range s.ReadyFirst {
		if err := l.Ready(p); err != nil {
			return err
		}
	}
	return nil
}

// Ready asks the backend, then each layer.
func (s Stack) Ready(p *plan.Plan) error {
	return s.each(func(b Backend) error { return b.Ready(p) })
}

// Skeleton names the first missing shared object of the backend or a
// layer; some exist when some of any of theirs do.
func (s Stack) Skeleton(p *plan.Plan) (missing string, some bool, err error) {
	for _, b := range append([]Backend{s.Base}, s.Layers...) {
		sk, ok := b.(Skeletal)
		if !ok {
			continue
		}
		m, so, err := sk.Skeleton(p)
		if err != nil {
			return "", false, err
		}
		if missing == "" {
			missing = m
		}
		some = some || so
	}
	return missing, some, nil
}

// GC collects in the backend and every layer; it goes on after an error.
func (s Stack) GC(network string, valid []plan.Owner) error {
	errs := []error{s.Base.GC(network, valid)}
	for _, l := range s.Layers {
		errs = append(errs, l.GC(network, valid))
	}
	return errors.Join(errs...)
}

func (s Stack) each(do func(Backend) error) error {
	if err := do(s.Base); err != nil {
		return err
	}
	for _, l := range s.Layers {
		if err := do(l); err != nil {
			return err
		}
	}
	return nil
}
