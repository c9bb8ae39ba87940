package agent

import (
	"fmt"
	"time"

	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Why a pass withholds a cached attachment (Withheld.Reason).
const (
	// WithheldDeleted: the attachment's DEL has begun (the pass read the
	// cache before it), or the runtime left its cache entry behind after
	// DEL.
	WithheldDeleted = "deleted"
	// WithheldGone: the container's network namespace no longer exists
	// (a runtime that crashed before DEL, a node that rebooted).
	WithheldGone = "gone"
	// WithheldSuperseded: the owner was ADDed again after the cache entry
	// the pass read was written, with other addresses or mappings.
	WithheldSuperseded = "superseded"
	// WithheldNewer: the owner's ledger record is of a verb a newer
	// release wrote: this one cannot judge it, and leaves it to that one.
	WithheldNewer = "newer"
)

// admission is what the ledger, read under the host-wide lock, says of a
// pass's cache entries and of the owners of the objects it finds: the
// decision that keeps a pass from bringing back a deleted container's
// host ports and from taking a live one's (pkg/ledger). It is pure but
// for gone, which looks at namespace files.
type admission struct {
	records map[plan.Owner]ledger.Record
	// byID indexes the Add records, and those of verbs a newer release
	// wrote, by container ID.
	byID map[string][]ledger.Record
	// epoch is when the ledger began; zero: no plugin kept one yet.
	epoch time.Time
	// cachedOn is the network of each (container ID, interface) the
	// cache read holds.
	cachedOn map[[2]string]string
	cached   map[plan.Owner]bool
	gone     func(netns string) bool
	// deleted are the cached owners admit withheld as WithheldDeleted.
	deleted map[plan.Owner]bool
}

func newAdmission(records map[plan.Owner]ledger.Record, epoch time.Time, atts []cnicache.Attachment, gone func(string) bool) *admission {
	ad := &admission{records: records, epoch: epoch, byID: map[string][]ledger.Record{},
		cachedOn: make(map[[2]string]string, len(atts)), cached: make(map[plan.Owner]bool, len(atts)), gone: gone,
		deleted: map[plan.Owner]bool{}}
	for _, r := range records {
		if r.Verb == ledger.Add || !r.Verb.Known() {
			ad.byID[r.ContainerID] = append(ad.byID[r.ContainerID], r)
		}
	}
	for _, at := range atts {
		ad.cachedOn[[2]string{at.ContainerID, at.IfName}] = at.Network
		ad.cached[plan.Owner{Network: at.Network, ContainerID: at.ContainerID, IfName: at.IfName}] = true
	}
	return ad
}

// withhold says why a pass must not write for the cached attachment
// (reason and what to report), or "" when it may.
func (ad *admission) withhold(at cnicache.Attachment, plans []*plan.Plan) (reason, why string) {
	o := plan.Owner{Network: at.Network, ContainerID: at.ContainerID, IfName: at.IfName}
	r, ok := ad.records[o]
	switch {
	case ok && !r.Verb.Known():
		return WithheldNewer, newerRecord(r.Verb)
	case ok && r.Verb == ledger.Del:
		return WithheldDeleted, "its DEL has begun: the cache entry is the runtime's, to remove"
	case !ok && !ad.epoch.IsZero() && !at.ModTime.Before(ad.epoch):
		return WithheldDeleted, "no ADD on record: its DEL has begun (the cache entry is the runtime's, to remove)"
	}
	netns := at.NetNS
	if ok && r.NetNS != "" {
		netns = r.NetNS
	}
	if ad.gone(netns) {
		return WithheldGone, fmt.Sprintf("its network namespace %s is gone", netns)
	}
	if ok && r.Plans != plan.Fingerprint(plans) {
		return WithheldSuperseded, "the cache entry predates the attachment's last ADD, which mapped something else"
	}
	return "", ""
}

// resolved is what the ADD on record of the cached attachment resolved
// "localhost": "auto" to, or "" where no record says.
func (ad *admission) resolved(at cnicache.Attachment) plan.Localhost {
	r, ok := ad.records[plan.Owner{Network: at.Network, ContainerID: at.ContainerID, IfName: at.IfName}]
	if !ok || r.Verb != ledger.Add {
		return ""
	}
	return r.Localhost
}

// newerRecord says why a record of verb v, which a newer release wrote,
// keeps this one's hands off its owner.
func newerRecord(v ledger.Verb) string {
	return fmt.Sprintf("its ledger record says %q, a verb of a newer release, which judges it", v)
}

// hold says why the objects of an owner (network "" for any) that no
// admitted attachment owns must stay, or "" when they are an orphan:
// the owner's ADD is on record, its namespace is alive, and the runtime
// caches its interface on no other network — an ADD in flight, or one
// whose cache entry the runtime has not written yet. Nor are the objects
// of an owner withheld as deleted taken while the runtime caches it:
// its DEL removes them, and an entry misjudged so (an ADD of an earlier
// plugin whose cache entry was written after the ledger began, during an
// upgrade) is a live container's.
func (ad *admission) hold(network, containerID string) string {
	for o := range ad.deleted {
		if o.ContainerID == containerID && (network == "" || o.Network == network) {
			return "its cache entry is the runtime's until its DEL returns"
		}
	}
	for _, r := range ad.byID[containerID] {
		if network != "" && r.Network != network {
			continue
		}
		if !r.Verb.Known() {
			return newerRecord(r.Verb)
		}
		if on, ok := ad.cachedOn[[2]string{r.ContainerID, r.IfName}]; ok && on != r.Network {
			continue // the interface is the runtime's on another network now
		}
		if ad.gone(r.NetNS) {
			continue
		}
		if ad.cached[r.Owner()] {
			return "its last ADD is newer than its cache entry"
		}
		return "its ADD is on record and its namespace alive: the runtime has not cached it yet"
	}
	return ""
}

// dead reports whether the ledger names the owner (network "" for any)
// gone: an ADD of it is on record and that namespace is gone.
func (ad *admission) dead(network, containerID string) bool {
	for _, r := range ad.byID[containerID] {
		if r.Verb == ledger.Add && (network == "" || r.Network == network) && ad.gone(r.NetNS) {
			return true
		}
	}
	return false
}

// stale are the records a pass forgets: a Del record of an owner the
// runtime no longer caches, and an Add record of one it does not cache
// whose namespace is gone.
func (ad *admission) stale() []plan.Owner {
	var out []plan.Owner
	for o, r := range ad.records {
		if ad.cached[o] || !r.Verb.Known() {
			continue // a newer release's record is that release's to forget
		}
		if r.Verb == ledger.Del || ad.gone(r.NetNS) {
			out = append(out, o)
		}
	}
	return out
}
