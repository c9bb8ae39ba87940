package portmap

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// GC (CNI 1.1) removes every mapping of this network that no valid
// attachment owns, in both families. It keeps going after an error and
// returns them all joined; it prints nothing.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	a, err := p.load(args)
	if err != nil {
		return err
	}
	valid, err := validAttachments(args.StdinData, a.Network)
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range plan.Families {
		s, err := p.Host.Stack(a.Backend, f, &a.Request)
		if host.NotInstalled(err) {
			continue // no tools for this family: nothing of it can exist
		}
		if err == nil {
			err = s.GC(a.Network, valid)
		}
		errs = append(errs, err)
	}
	errs = append(errs, p.forgetInvalid(a.Network, valid))
	return cniError(a, errors.Join(errs...))
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
