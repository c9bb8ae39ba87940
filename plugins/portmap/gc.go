package portmap

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// GC (CNI 1.1) removes every mapping of this network that no valid
// attachment owns, in both families. It keeps going after an error and
// returns them all joined; it prints nothing.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	c, err := p.parse(args)
	if err != nil {
		return err
	}
	valid, err := validAttachments(args.StdinData, c.Network)
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range plan.Families {
		s, err := p.Host.Stack(c.Backend, f, &c.Request)
		if host.NotInstalled(err) {
			continue // no tools for this family: nothing of it can exist
		}
		if err == nil {
			err = s.GC(c.Network, valid)
		}
		errs = append(errs, err)
	}
	return cniError(c, errors.Join(errs...))
}

// validAttachments reads cni.dev/valid-attachments, or the older
// cni.dev/attachments when the first is absent.
func validAttachments(stdin []byte, network string) ([]plan.Owner, error) {
	var raw struct {
		Valid *[]types.GCAttachment `json:"cni.dev/valid-attachments"`
		Old   *[]types.GCAttachment `json:"cni.dev/attachments"`
	}
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode valid attachments: %v", err), "")
	}
	list := raw.Valid
	if list == nil {
		list = raw.Old
	}
	var out []plan.Owner
	if list != nil {
		for _, a := range *list {
			out = append(out, plan.Owner{Network: network, ContainerID: a.ContainerID, IfName: a.IfName})
		}
	}
	return out, nil
}

// Status (CNI 1.1) answers code 50 when the selected backend cannot serve
// ADD, with the reason; code 51 when it can but the node's shared objects
// are gone or broken (a firewall flush took the jumps from the built-in
// chains, or the table) while cached attachments of this network hold
// host ports of that family — their ports do not forward until `portmap
// sync` (or the agent) repairs them; otherwise nil. It reads the shared
// objects, not the attachments', and the cache only when something is
// missing of a family that was set up (some of its skeleton left, or
// none of any family's: a flush of the whole ruleset).
func (p *Plugin) Status(args *skel.CmdArgs) error {
	c, err := p.parse(args)
	if err != nil {
		return err
	}
	notAvailable := func(err error) error {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("%s backend cannot serve ADD: %v", c.Backend, err), "")
	}
	s, err := p.Host.Stack(c.Backend, plan.IPv4, &c.Request)
	if err == nil {
		err = s.Ready(plan.Build(c.Request, plan.IPv4, nil))
	}
	if err == nil && len(c.Request.ConditionsV6) > 0 {
		err = s.Ready(plan.Build(c.Request, plan.IPv6, nil)) // what it needs for them
	}
	if err != nil {
		return notAvailable(err)
	}
	stacks := map[plan.Family]backend.Stack{plan.IPv4: s}
	if s6, err := p.Host.Stack(c.Backend, plan.IPv6, &c.Request); err == nil {
		stacks[plan.IPv6] = s6 // a host without IPv6 tools has no IPv6 rules to lose
	}
	found := map[plan.Family]string{}
	some := map[plan.Family]bool{}
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		st, ok := stacks[f]
		if !ok {
			continue
		}
		what, so, err := st.Skeleton(plan.Build(c.Request, f, nil))
		if err != nil {
			return notAvailable(fmt.Errorf("read the shared rules: %w", err))
		}
		found[f], some[f] = what, so
	}
	// A family with nothing of its skeleton left while the other has some
	// was never set up (IPv4 host ports only): asking the cache about it
	// would read every file of the network on a healthy node.
	anySome := some[plan.IPv4] || some[plan.IPv6]
	missing := map[plan.Family]string{}
	fams := map[int]bool{}
	for f, what := range found {
		if what != "" && (some[f] || !anySome) {
			missing[f] = what
			fams[familyNumber(f)] = true
		}
	}
	if len(missing) == 0 {
		return nil
	}
	file, err := cnicache.Mapped(c.CacheDir, c.Network, fams)
	if err != nil || file == "" {
		return nil // no attachment known to lose anything: ADD makes them
	}
	var whats []string
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		if missing[f] != "" {
			whats = append(whats, fmt.Sprintf("%s: %s", f, missing[f]))
		}
	}
	return types.NewError(ErrLimitedConnectivity,
		fmt.Sprintf("existing containers' host ports may not forward: the %s backend's shared rules are broken (%s); `portmap sync` repairs them",
			c.Backend, strings.Join(whats, "; ")),
		"cached attachment "+file)
}

// ErrLimitedConnectivity is CNI 1.1's STATUS code 51: the plugin cannot
// serve existing containers fully (types has no name for it).
const ErrLimitedConnectivity = 51

func familyNumber(f plan.Family) int {
	if f == plan.IPv6 {
		return 6
	}
	return 4
}
