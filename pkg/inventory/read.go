package inventory

import (
	"errors"

	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Read returns the host-port table of h: every backend and layer (a
// placed layer at its default site and at the sites of sites), both
// families. One whose tools are not installed contributes nothing.
func Read(h *host.Host, sites ...*plan.Request) ([]Entry, error) {
	var all []Entry
	var errs []error
	for _, f := range plan.Families {
		es, err := family(h, f, sites)
		all, errs = append(all, es...), append(errs, err)
	}
	Sort(all)
	return all, errors.Join(errs...)
}

// Family returns the host ports of family f that h's backends and layers
// (at their default sites) forward, each read back by the package that
// writes it.
func Family(h *host.Host, f plan.Family) ([]Entry, error) { return family(h, f, nil) }

func family(h *host.Host, f plan.Family, sites []*plan.Request) ([]Entry, error) {
	var all []Entry
	var errs []error
	read := func(name string, b interface {
		Mappings() ([]plan.Installed, error)
	}, err error) {
		if host.NotInstalled(err) {
			return
		}
		if err != nil {
			errs = append(errs, err)
			return
		}
		ms, err := b.Mappings()
		all, errs = append(all, FromInstalled(ms, name)...), append(errs, err)
	}
	for _, k := range h.Kinds {
		b, err := h.Open(k.Name, f)
		read(string(k.Name), b, err)
	}
	for _, l := range h.Layers {
		b, err := h.OpenLayer(l, f, nil)
		read(l.Name, b, err)
		seen := map[string]bool{"": true}
		for _, req := range sites {
			if s := l.SiteOf(req); l.Site != nil && !seen[s] {
				seen[s] = true
				b, err := h.OpenLayer(l, f, req)
				read(l.Name, b, err)
			}
		}
	}
	return all, errors.Join(errs...)
}

// OnHost is what the "reject" host-port conflict policy reads of h.
type OnHost struct{ Host *host.Host }

// Mappings returns the host ports mapped in family f.
func (o OnHost) Mappings(f plan.Family) ([]Entry, error) { return Family(o.Host, f) }

// Listener names a host socket that would receive (hostIP, port), or "".
func (OnHost) Listener(proto, hostIP string, port int) (string, error) {
	return Listener(proto, hostIP, port)
}
