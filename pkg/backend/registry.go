package backend

import (
	"errors"
	"io"
	"os/exec"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/backend/socket"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

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
	// that is ErrNotInstalled means its tools are not installed, so
	// nothing of it can exist on this host.
	Open func(f plan.Family, log io.Writer) (Backend, error)
	// BadConditionToken says why tok cannot be one token of
	// conditionsV4/V6 in this backend's syntax, or "".
	BadConditionToken func(tok string) string
	// Installed says whether the backend's tools are on PATH, by a look
	// at PATH only (no process): the default backend is the first kind
	// installed.
	Installed func() bool
}

// Kinds is the registry of backends, in the order the agent syncs them
// and the default is chosen: iptables where its tools are, else
// nftables — as upstream chooses.
var Kinds = []Kind{
	{IPTables, openIPTables, iptables.BadConditionToken, iptablesInstalled},
	{NFTables, openNFTables, nftables.BadConditionToken, nftablesInstalled},
}

func iptablesInstalled() bool {
	_, err := exec.LookPath(iptables.RestoreCommand(plan.IPv4))
	return err == nil
}

// nftablesInstalled: the backend talks to the kernel over netlink and
// needs no nft binary.
func nftablesInstalled() bool { return true }

// Choices names the registered backends for an error: `"iptables" or
// "nftables"`.
func Choices() string {
	q := make([]string, len(Kinds))
	for i, k := range Kinds {
		q[i] = strconv.Quote(string(k.Name))
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// Default is the backend a configuration without "backend" uses on this
// host: the first of kinds installed (the last when none says so).
func Default(kinds []Kind) Name {
	for _, k := range kinds {
		if k.Installed == nil || k.Installed() {
			return k.Name
		}
	}
	if len(kinds) == 0 {
		return ""
	}
	return kinds[len(kinds)-1].Name
}

func openIPTables(f plan.Family, _ io.Writer) (Backend, error) {
	b, err := iptables.New(f)
	if errors.Is(err, exec.ErrNotFound) {
		err = notInstalled{err}
	}
	return opened(f, b, err)
}

// ErrNotInstalled marks the error of opening a backend whose tools are not
// installed (iptables without iptables-restore on PATH): nothing of that
// backend can exist on the host, so DEL, GC and the agent pass over it. A
// tool missing elsewhere (nft for conditions) is an error like any other.
var ErrNotInstalled = errors.New("the backend's tools are not installed")

// notInstalled is err marked ErrNotInstalled, its text unchanged.
type notInstalled struct{ error }

func (e notInstalled) Is(target error) bool { return target == ErrNotInstalled }
func (e notInstalled) Unwrap() error        { return e.error }

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
	// Site names the instance req's attachments use, for a layer whose
	// configuration places it apart (the socket path's pin directory,
	// "" the default one); nil for a layer with one instance, which
	// leaves Normalize and SiteReady nil too.
	Site func(req *plan.Request) string
	// Normalize writes req's site in its one spelling (the default site
	// named by its path becomes ""), so that two spellings of one site
	// are one instance.
	Normalize func(req *plan.Request)
	// SiteReady says what the host lacks to serve the layer at req's
	// site, for every family at once, or nil; "localhost": "auto" asks
	// it.
	SiteReady func(req *plan.Request) error
	// ReadyFirst makes ADD ask the layer's Ready before anything is
	// written, so that a host that cannot serve it fails ADD with nothing
	// changed (a cheap Ready: no process).
	ReadyFirst bool
	// Open returns the layer of family f on the real kernel, at req's
	// site (req is nil for the default site).
	Open func(f plan.Family, log io.Writer, req *plan.Request) (Backend, error)
}

// SiteOf is the instance of l that req uses ("" for the default one, and
// for a layer with one instance).
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
		Site: socketSite, Normalize: socketNormalize, SiteReady: socketReady, ReadyFirst: true, Open: openSocket},
}

// LayerNamed returns the registered layer called name.
func LayerNamed(name string) (Layer, bool) {
	for _, l := range Layers {
		if l.Name == name {
			return l, true
		}
	}
	return Layer{}, false
}

// Normalize writes every site of req in its one spelling (each layer's
// Normalize).
func Normalize(req *plan.Request) {
	for _, l := range Layers {
		if l.Normalize != nil {
			l.Normalize(req)
		}
	}
}

// socketNormalize names the default pin directory "".
func socketNormalize(r *plan.Request) {
	if r.Socket.PinDir == socket.DefaultPinDir {
		r.Socket.PinDir = ""
	}
}

// socketReady asks the site of req whether the host can serve it.
func socketReady(r *plan.Request) error {
	s, err := socket.OpenSite(r.Socket)
	if err != nil {
		return err
	}
	return s.Ready()
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
