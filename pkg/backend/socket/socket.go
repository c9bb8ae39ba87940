// Package socket is the socket path: a process on the node reaches a
// host port at 127.0.0.1 or [::1] because cgroup v2 socket-address
// programs rewrite its destination to the container's address when it
// calls connect() or sendmsg(), and rewrite it back for recvmsg() and
// getpeername(). No NAT, no route_localnet, no proxy: the client talks to
// the container directly.
//
//	<cgroupPath>  ── links ──►  connect4/6, sendmsg4/6     svc: {netns cookie, addr, port, proto}
//	                            (forward: dialled → target)      → {container addr, port, rank, owner}
//	                            recvmsg4/6, getpeername4/6  rev: {socket cookie, target}
//	                            (reverse: target → dialled)      → dialled addr, port   (LRU)
//	<pinDir>/v1/  svc, rev, owners, and one pinned link per hook
//
// It is a layer (see pkg/backend): the configured backend still maps the
// host ports for remote clients; "localhost": "socket" adds this layer
// and drops the backend's localhost rule and route_localnet.
//
// Scope: the key holds the cookie of the network namespace the verb ran
// in, so only sockets of the node's namespace are rewritten — a
// container's own localhost never is, and several node namespaces on one
// kernel do not see each other's ports. A wildcard mapping is served at
// 127.0.0.1 (and ::ffff:127.0.0.1) and ::1; a mapping with a loopback
// host IP at that address. The rest of 127.0.0.0/8 is left alone, and so
// is every address that is not loopback, the node's own too: the DNAT
// rules judge those packet by packet, as the addresses come and go.
//
// Ownership is the NAT path's: an entry names its attachment (OwnerID);
// ADD takes the keys it wants (newest wins; an exact host IP beats a
// wildcard's loopback entry), DEL deletes only entries that name it,
// CHECK compares, GC and sync judge entries by owner.
package socket

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/portmap-dev/portmap/pkg/caps"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/netns"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Layer is the socket path of one family at one site.
type Layer struct {
	Family plan.Family
	Site   Site
	// Netns returns the cookie of the namespace the process runs in.
	Netns func() (uint64, error)
	// Lock takes the host-wide lock.
	Lock func() (release func(), err error)
}

// New returns the socket path of family f at the site of cfg on the
// running kernel.
func New(f plan.Family, cfg plan.Socket) (*Layer, error) {
	s, err := OpenSite(cfg)
	if err != nil {
		return nil, err
	}
	return &Layer{Family: f, Site: s, Netns: NetnsCookie, Lock: lock.Host}, nil
}

// NetnsCookie is the cookie of the calling thread's network namespace.
func NetnsCookie() (uint64, error) {
	c, err := netns.Cookie()
	if err != nil {
		return 0, fmt.Errorf("socket path: %w", err)
	}
	return c, nil
}

// locked runs do under the host-wide lock, with the namespace's state.
func (l *Layer) locked(do func(st *State, netns uint64) error) error {
	return l.lockedRead(func(netns uint64) (*State, error) { return l.Site.Read(netns, l.Family) }, do)
}

// lockedRead is locked with what read reads of the namespace's state.
func (l *Layer) lockedRead(read func(netns uint64) (*State, error), do func(st *State, netns uint64) error) error {
	netns, err := l.Netns()
	if err != nil {
		return err
	}
	release, err := l.Lock()
	if err != nil {
		return err
	}
	defer release()
	st, err := read(netns)
	if err != nil {
		return err
	}
	return do(st, netns)
}

func (l *Layer) write(netns uint64, w *Write) error {
	return l.Site.Write(netns, l.Family, w)
}

// broken returns the hooks that are not right.
func broken(states []HookState) []HookState {
	var out []HookState
	for _, st := range states {
		if st.Problem != HookOK {
			out = append(out, st)
		}
	}
	return out
}

// Apply installs the programs where they are not (the first ADD of the
// site, a detached link, another build's programs), then writes the
// attachment's entries, replacing what it held in this family.
func (l *Layer) Apply(p *plan.Plan) (err error) {
	defer func() { err = explain(err) }()
	if p.ContainerNet == nil {
		return errors.New("socket path: no container address to send connections to")
	}
	read := func(netns uint64) (*State, error) { return l.readFor(p, netns) }
	return l.lockedRead(read, func(st *State, netns uint64) error {
		w := apply(st, p, netns)
		if len(Entries(p, netns)) > 0 {
			states, err := l.Site.Hooks()
			if err != nil {
				return err
			}
			if bad := broken(states); len(bad) > 0 {
				if err := l.Site.Install(bad); err != nil {
					return err
				}
			}
		}
		return l.write(netns, w)
	})
}

// readFor reads what ADD of p needs to know: where the attachment holds
// no owner entry in this family and none of its keys is held, the
// lookups of its keys are all of it: entries are written after their
// owner's entry and deleted before it, so it holds no entry, apply
// deletes nothing and takes no key over. Otherwise (a second ADD, a key
// another attachment holds) the family's entries and owner entries whole: a
// dump walks every bucket of the entries map, which has room for a
// million, about a millisecond whatever it holds.
func (l *Layer) readFor(p *plan.Plan, netns uint64) (*State, error) {
	want := Entries(p, netns)
	keys := make([]Key, len(want))
	for i, e := range want {
		keys[i] = e.Key
	}
	st, err := l.Site.ReadKeys(netns, l.Family, keys, OwnerID(p.Owner))
	if err != nil || len(st.Owners) == 0 && len(st.Entries) == 0 {
		return st, err
	}
	return l.Site.Read(netns, l.Family)
}

// Remove deletes the entries of this family that name the attachment;
// idempotent, and a site never installed has none.
func (l *Layer) Remove(p *plan.Plan) (err error) {
	defer func() { err = explain(err) }()
	if !l.Site.Exists() {
		return nil
	}
	return l.locked(func(st *State, netns uint64) error {
		return l.write(netns, remove(st, p.Owner, l.Family))
	})
}

// Check verifies that every hook's link is attached at the cgroup with
// this build's program, and that the attachment's entries send their
// keys to the container.
func (l *Layer) Check(p *plan.Plan) (err error) {
	defer func() { err = explain(err) }()
	if p.ContainerNet == nil {
		return errors.New("socket path: no container address to check against")
	}
	netns, err := l.Netns()
	if err != nil {
		return err
	}
	if len(Entries(p, netns)) == 0 {
		return nil
	}
	s := l.Site
	states, err := s.Hooks()
	if err != nil {
		return err
	}
	if bad := broken(states); len(bad) > 0 {
		return fmt.Errorf("socket path: %s", bad[0])
	}
	st, err := s.Read(netns, l.Family)
	if err != nil {
		return err
	}
	return check(st, p, netns)
}

// GC removes the entries of network's attachments that are not in
// valid.
func (l *Layer) GC(network string, valid []plan.Owner) (err error) {
	defer func() { err = explain(err) }()
	if !l.Site.Exists() {
		return nil
	}
	return l.locked(func(st *State, netns uint64) error {
		return l.write(netns, gc(st, network, valid, l.Family))
	})
}

// Ready says what the host lacks to serve the socket path for p.
func (l *Layer) Ready(p *plan.Plan) error {
	if err := l.Site.Ready(); err != nil {
		return err
	}
	_, err := l.Netns()
	return err
}

// needs are what the socket path asks of the kernel: bpf() (CAP_BPF, or
// CAP_SYS_ADMIN before Linux 5.8) and links on a cgroup (CAP_NET_ADMIN).
var needs = []caps.Any{{caps.BPF, caps.SysAdmin}, {caps.NetAdmin}}

// explain names the capabilities this process lacks where the kernel
// refused it for want of one (an agent's container given fewer than the
// socket path needs skips it and says which).
func explain(err error) error {
	if err == nil {
		return nil
	}
	return caps.Explain(err, needs...)
}

// hooksMu serializes Sync's look at the hooks and their repair within
// the process (the host-wide lock keeps other processes out).
var hooksMu sync.Mutex

// Sync repairs the hooks, then brings the entries to the wanted plans
// (see entryDiff): a pass of its own for the node-wide programs, then
// one for the entries, read once and written at most once. The caller
// holds the host-wide lock.
func (l *Layer) Sync(want []*plan.Plan, o converge.Options) (_ *converge.Report, err error) {
	defer func() { err = explain(err) }()
	// nothing wanted and nothing installed: nothing to ask the kernel
	// (a kernel before 5.14 has no netns cookie, and its passes must not
	// fail for a path no attachment takes)
	if len(want) == 0 && !l.Site.Exists() {
		return converge.NewReport(0), nil
	}
	netns, err := l.Netns()
	if err != nil {
		return nil, err
	}
	// the families' passes run at once and share the hooks: one looks
	// and repairs at a time, so the other finds them right
	hooksMu.Lock()
	defer hooksMu.Unlock()
	shared, installed, err := l.syncHooks(len(want) > 0, o.DryRun)
	if err != nil {
		return nil, err
	}
	type read struct {
		st *State
		d  entryDiff
	}
	rep, err := converge.Run(len(want), o, converge.Pass[read, Key]{
		Read: func() (read, error) {
			st, err := l.Site.Read(netns, l.Family)
			if err != nil {
				return read{}, err
			}
			return read{st, diffEntries(st, want, netns, l.Family)}, nil
		},
		Decide: func(r read) converge.Verdict[Key] {
			v := converge.Verdict[Key]{Whys: r.d.whys}
			for _, k := range r.d.orphans {
				own := r.st.Owners[r.st.Entries[k].Owner] // zero when unknown
				v.Candidates = append(v.Candidates, converge.Candidate[Key]{Network: own.Network, ContainerID: own.ContainerID,
					Object: "socket entry " + k.String(), Handle: k})
			}
			w := &Write{}
			ownerEntries(r.st, want, w, o.Prune)
			v.Tidy = !w.Empty()
			return v
		},
		Write: func(r read, fix converge.Repair[Key]) (bool, error) {
			w := &Write{Put: r.d.put, Delete: append(slices.Clip(r.d.stale), fix.Prune...)}
			ownerEntries(r.st, want, w, o.Prune)
			if w.Empty() {
				return false, nil
			}
			return true, l.write(netns, w)
		},
	})
	if rep != nil {
		rep.Shared = append(shared, rep.Shared...)
		rep.Wrote = rep.Wrote || installed
	}
	return rep, err
}

// syncHooks judges the hooks when the programs are wanted, and repairs
// what is broken unless dryRun: what it found, and whether it wrote.
func (l *Layer) syncHooks(wanted, dryRun bool) ([]string, bool, error) {
	if !wanted { // nothing wants the programs: orphans only
		return nil, false, nil
	}
	states, err := l.Site.Hooks()
	if err != nil {
		return nil, false, err
	}
	bad := broken(states)
	var shared []string
	for _, st := range bad {
		shared = append(shared, "socket path "+st.String())
	}
	if len(bad) == 0 || dryRun {
		return shared, false, nil
	}
	if err := l.Site.Install(bad); err != nil {
		return nil, false, err
	}
	return shared, true, nil
}

// Retire removes the site when no attachment of any namespace holds an
// entry in it (see Site.Retire). The caller holds the host-wide lock.
func (l *Layer) Retire() (string, error) {
	removed, err := l.Site.Retire()
	if err != nil || !removed {
		return "", explain(err)
	}
	return "socket path: no entry left; programs detached, pins removed", nil
}

// Mappings reads back the entries of this family.
func (l *Layer) Mappings() ([]plan.Installed, error) {
	if !l.Site.Exists() {
		return nil, nil
	}
	netns, err := l.Netns()
	if err != nil {
		return nil, err
	}
	st, err := l.Site.Read(netns, l.Family)
	if err != nil {
		return nil, err
	}
	return installed(st, l.Family), nil
}
