package portmap

import (
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/attach"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Status (CNI 1.1) answers whether ADD can be served, as the spec
// says: nil whenever it can — also after a firewall flush took the
// shared rules, which the next ADD re-creates. containerd turns a STATUS
// error into the node's NetworkReady=false, which kubelet polls: a flush
// must not make a node NotReady. Where existing containers' host ports
// stand after a flush is what CHECK (per attachment), `portmap-agent sync
// --dry-run` and the agent (its log, /healthz, metrics) report.
//
// When ADD cannot be served it answers code 50 with the reason, or 51
// ("not available, and existing containers may have limited
// connectivity") when, besides, the shared rules of a family are broken
// while the cache holds an attachment of this network with host ports of
// that family. The shared objects and the cache are read only then.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	a, err := p.load(args)
	if err != nil {
		return err
	}
	s, err := p.Host.Stack(a.Backend, plan.IPv4, &a.Request)
	if err == nil {
		err = s.Ready(plan.Build(a.Request, plan.IPv4, nil))
	}
	if err == nil && len(a.Request.ConditionsV6) > 0 {
		err = s.Ready(plan.Build(a.Request, plan.IPv6, nil)) // what it needs for them
	}
	if err == nil {
		return nil
	}
	why := fmt.Sprintf("%s backend cannot serve ADD: %v", a.Backend, err)
	if broken, file := p.brokenWithAttachments(a); broken != "" {
		return types.NewError(ErrLimitedConnectivity,
			fmt.Sprintf("%s; and existing containers' host ports may not forward: its shared rules are broken (%s)", why, broken),
			"cached attachment "+file)
	}
	return types.NewError(types.ErrPluginNotAvailable, why, "")
}

// brokenWithAttachments names the backend's broken shared objects of
// each family (a firewall flush took the jumps from the built-in chains,
// or the table) whose host ports a cached attachment of this network
// holds, and one such cache file; "" when there are none, or when the
// shared objects cannot be read. A family with nothing of its skeleton
// left while the other has some was never set up (IPv4 host ports only):
// the cache is not asked about it.
func (p *Plugin) brokenWithAttachments(c *attach.Attachment) (broken, file string) {
	found := map[plan.Family]string{}
	some := map[plan.Family]bool{}
	for _, f := range plan.Families {
		st, err := p.Host.Stack(c.Backend, f, &c.Request)
		if err != nil {
			continue // no tools of this family: no rules of it to lose
		}
		what, so, err := st.Skeleton(plan.Build(c.Request, f, nil))
		if err != nil {
			continue
		}
		found[f], some[f] = what, so
	}
	anySome := some[plan.IPv4] || some[plan.IPv6]
	var whats []string
	fams := map[int]bool{}
	for _, f := range plan.Families {
		if what := found[f]; what != "" && (some[f] || !anySome) {
			whats = append(whats, fmt.Sprintf("%s: %s", f, what))
			fams[int(f)] = true
		}
	}
	if len(whats) == 0 {
		return "", ""
	}
	file, err := cnicache.Mapped(c.CacheDir, c.Network, fams)
	if err != nil || file == "" {
		return "", ""
	}
	return strings.Join(whats, "; "), file
}

// ErrLimitedConnectivity is CNI 1.1's STATUS code 51: the plugin is not
// available, and existing containers may have limited connectivity
// (types has no name for it).
const ErrLimitedConnectivity = 51
