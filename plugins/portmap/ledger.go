package portmap

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/attach"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// recordAdd records, under the host-wide lock and before any rule is
// written, that the attachment's ADD has begun, with what it maps and the
// container's namespace: from then on no agent pass prunes what this ADD
// writes before the runtime caches it, and none repairs the attachment
// from a cache entry older than this ADD (pkg/ledger).
func (p *Plugin) recordAdd(a *attach.Attachment, netnsPath string) error {
	r := ledger.New(a.Request.Owner, ledger.Add)
	r.NetNS, r.Plans = netnsPath, plan.Fingerprint(a.Plans)
	if a.Auto {
		r.Localhost = a.Request.Localhost
	}
	return p.inLedger(func(l ledger.Ledger) error {
		if err := l.Write(r); err != nil {
			// Not the backend's: nothing has been written yet.
			return types.NewError(types.ErrInternal, fmt.Sprintf("record the ADD in the ledger: %v", err), "")
		}
		return nil
	})
}

// recordDel forgets the attachment's ADD under the host-wide lock before
// DEL removes anything, so that no agent pass repairs it from the cache
// entry the runtime removes only after DEL returns. An attachment ADDed
// before this node's plugin kept a ledger has no record: while the
// runtime still caches it, DEL leaves a Del record in its place.
func (p *Plugin) recordDel(a *attach.Attachment) error {
	o := a.Request.Owner
	return p.inLedger(func(l ledger.Ledger) error {
		had, err := l.Forget(o)
		if err != nil || had || !cnicache.Cached(a.CacheDir, o.Network, o.ContainerID, o.IfName) {
			return err
		}
		return l.Write(ledger.New(o, ledger.Del))
	})
}

func (p *Plugin) inLedger(do func(ledger.Ledger) error) error {
	if p.Host.Ledger == nil {
		return nil
	}
	release, err := p.Host.Lock()
	if err != nil {
		return fmt.Errorf("take the host-wide lock: %w", err)
	}
	defer release()
	return do(p.Host.Ledger)
}

// forgetInvalid forgets the ledger's records of network that no valid
// attachment owns (GC): what GC removed is no longer the runtime's.
func (p *Plugin) forgetInvalid(network string, valid []plan.Owner) error {
	keep := make(map[plan.Owner]bool, len(valid))
	for _, o := range valid {
		keep[o] = true
	}
	return p.inLedger(func(l ledger.Ledger) error {
		recs, _, err := l.Read()
		var ue *ledger.UnreadError
		if err != nil && !errors.As(err, &ue) && !errors.Is(err, ledger.ErrNone) { // files that are no records are not forgotten here
			return err
		}
		for o := range recs {
			if o.Network == network && !keep[o] {
				if _, err := l.Forget(o); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
