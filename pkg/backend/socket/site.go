package socket

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// DefaultPinDir is where the programs' maps and links are pinned when
// the configuration names no "bpfPinDir".
const DefaultPinDir = "/sys/fs/bpf/cni-portmap"

// Layout is the version of the pin layout under the pin directory: the
// maps' key and value layouts and the links' names. A build that changes
// them pins under another version and migrates.
const Layout = "v1"

// Pin names under <pinDir>/<Layout>; links are pinned under the hook's
// name, their programs as prog_<hook> (progPin).
const (
	svcMap    = "svc"
	revMap    = "rev"
	ownersMap = "owners"
)

// The maps' sizes: svc holds every TCP/UDP host port of every
// attachment's loopback and exact host-IP entries, allocated as used; rev
// is an LRU of the sockets that were rewritten, so it never grows past
// its size (a socket whose entry was evicted sees the container's address
// in getpeername/recvfrom).
const (
	svcEntries    = 1 << 20
	revEntries    = 1 << 16
	ownersEntries = 1 << 16
)

// HookState is what a hook's pinned link is found to be.
type HookState struct {
	Hook Hook
	// Problem is "" when the link is attached to the configured cgroup
	// with this build's program; else what is wrong.
	Problem Problem
	// Detail names what was found (another cgroup, another version).
	Detail string
}

// Problem is a hook's fault, and so what installing does about it.
type Problem string

const (
	HookOK       Problem = ""
	HookMissing  Problem = "missing"  // no link pinned: attach one
	HookDetached Problem = "detached" // pinned, attached nowhere: replace it
	HookMoved    Problem = "moved"    // attached to another cgroup: replace it
	HookStale    Problem = "stale"    // another build's program: update in place
)

// Action is what installing does about a hook in state s.
func (s HookState) Action() string {
	switch s.Problem {
	case HookMissing:
		return "attach"
	case HookDetached, HookMoved:
		return "replace"
	case HookStale:
		return "update"
	}
	return ""
}

func (s HookState) String() string {
	if s.Detail != "" {
		return fmt.Sprintf("link %s %s (%s)", s.Hook.Name, s.Problem, s.Detail)
	}
	return fmt.Sprintf("link %s %s", s.Hook.Name, s.Problem)
}

// Site is one place the socket path lives: a cgroup its programs attach
// to and a pin directory. The layer drives it through this interface; a
// fake stands in for it in unit tests.
type Site interface {
	// Exists reports whether anything is pinned (DEL of a site never
	// installed is done).
	Exists() bool
	// Read returns the entries and owner entries of family f in the
	// namespace netns.
	Read(netns uint64, f plan.Family) (*State, error)
	// ReadKeys is Read of the entries of keys and the owner entry of
	// id alone: lookups, where Read dumps both maps (the entries map
	// has room for a million, and a dump walks every bucket).
	ReadKeys(netns uint64, f plan.Family, keys []Key, id uint64) (*State, error)
	// Write applies w to the maps of family f in netns: owner entries
	// put, entries put, entries deleted, owner entries deleted.
	Write(netns uint64, f plan.Family, w *Write) error
	// Hooks reports each hook's link.
	Hooks() ([]HookState, error)
	// Install creates what is missing (pin directory, maps) and brings
	// each hook of states to this build's program on the cgroup.
	Install(states []HookState) error
	// Ready says what this host lacks to install the site, or nil.
	Ready() error
	// Retire removes the site when no entry and no owner entry of any
	// namespace or family remains: the links (which detaches the
	// programs), the maps, the layout directory. It reports whether it
	// did.
	Retire() (bool, error)
}

// kernelSite is a Site on the running kernel.
type kernelSite struct {
	cfg    plan.Socket
	dir    string // <pinDir>/<Layout>
	cgroup string // resolved cgroup path, once resolveCgroup ran
	svc    *ebpf.Map
	owners *ebpf.Map
}

// OpenSite returns the site of cfg on the running kernel; nothing is
// created until Install.
func OpenSite(cfg plan.Socket) (Site, error) {
	pin := cfg.PinDir
	if pin == "" {
		pin = DefaultPinDir
	}
	return &kernelSite{cfg: cfg, dir: filepath.Join(pin, Layout)}, nil
}

func (s *kernelSite) pin(name string) string { return filepath.Join(s.dir, name) }

// progPin is the pin name of hook h's program, beside its link: a pass
// compares the two without looking the program up by its ID. (bpffs
// refuses names with a dot.)
func progPin(h Hook) string { return "prog_" + h.Name }

func (s *kernelSite) Exists() bool {
	_, err := os.Stat(s.pin(svcMap))
	return err == nil
}

// errBigEndian is Ready's answer on a big-endian machine (s390x): the
// programs' instructions and the maps' keys and values are encoded
// little-endian, and no big-endian kernel has run them.
var errBigEndian = fmt.Errorf("socket path: not available on big-endian machines (%s): leave out the \"socket\" key, the DNAT rules serve every client", runtime.GOARCH)

// bigEndian reports whether this machine stores the low byte last.
func bigEndian() bool { return binary.NativeEndian.Uint16([]byte{0, 1}) == 1 }

// Ready says what the host lacks: a cgroup v2 directory at the cgroup
// path, a bpf filesystem under the pin directory, the kernel's cgroup
// socket-address programs with bpf_get_netns_cookie and links, and the
// privilege to load them.
func (s *kernelSite) Ready() error {
	if bigEndian() {
		return errBigEndian
	}
	if err := s.resolveCgroup(); err != nil {
		return err
	}
	if s.cgroup == "" {
		if !cgroup2Supported() {
			return errors.New("socket path: the kernel has no cgroup v2 (no cgroup2 in /proc/filesystems)")
		}
		// Install mounts the hierarchy at PrivateCgroup2, where the
		// node's init sees it
		if err := mountHere("cgroup v2 hierarchy mounted", "mount one on the node (mount -t cgroup2 none /sys/fs/cgroup), or set cgroupPath"); err != nil {
			return err
		}
	} else if t, err := fsType(s.cgroup); err != nil {
		return fmt.Errorf("socket path: cgroupPath %q: %w", s.cgroup, err)
	} else if t != cgroup2Magic {
		return fmt.Errorf("socket path: cgroupPath %q is not a cgroup v2 directory", s.cgroup)
	}
	if at, ok := onBPFFS(s.dir); !ok && !s.mountsBPFFS() {
		return fmt.Errorf("socket path: bpfPinDir %q is not on a bpf filesystem (%s is not bpffs)", filepath.Dir(s.dir), at)
	} else if ok && readOnly(at) && !s.Exists() {
		return fmt.Errorf("socket path: bpfPinDir %q is on a read-only bpf filesystem (%s): nothing can be pinned there", filepath.Dir(s.dir), at)
	} else if ok && privateMount(at) {
		return fmt.Errorf("socket path: bpfPinDir %q is on a bpf filesystem (%s) that the node's init does not see: it is mounted in this process's mount namespace alone, and the pins in it would die with that namespace (a runtime's restart); mount the node's bpf filesystem into the runtime's namespace, or set bpfPinDir to a directory on it", filepath.Dir(s.dir), at)
	} else if !ok {
		// Install mounts one at /sys/fs/bpf, where the node's init sees it
		if err := mountHere("bpf filesystem at "+bpffsRoot, "mount one on the node (mount -t bpf bpffs "+bpffsRoot+"), or set bpfPinDir to a directory on one"); err != nil {
			return err
		}
	}
	if s.Exists() {
		return nil // installed: the kernel and the privilege were there
	}
	if err := haveNetnsCookie(); err != nil {
		return fmt.Errorf("socket path: the kernel lacks cgroup socket-address programs with bpf_get_netns_cookie (Linux 5.8 or later, CAP_BPF or CAP_SYS_ADMIN): %w", err)
	}
	return nil
}

// bpffsRoot is where a host's bpf filesystem is mounted by convention.
const bpffsRoot = "/sys/fs/bpf"

// mountsBPFFS reports whether Install mounts the bpf filesystem at
// /sys/fs/bpf for the pin directory, as Cilium does: the pin directory
// is under it and nothing is mounted there.
func (s *kernelSite) mountsBPFFS() bool {
	if !strings.HasPrefix(s.dir, bpffsRoot+"/") {
		return false
	}
	t, err := fsType(bpffsRoot)
	return err == nil && t != bpffsMagic
}

func (s *kernelSite) open() error {
	if s.svc != nil {
		return nil
	}
	svc, err := loadMap(s.pin(svcMap), ebpf.Hash, keySize, valueSize)
	if err != nil {
		return err
	}
	owners, err := loadMap(s.pin(ownersMap), ebpf.Hash, ownerKey, ownerSize)
	if err != nil {
		svc.Close()
		return err
	}
	s.svc, s.owners = svc, owners
	return nil
}

// loadMap opens a pinned map and checks its layout.
func loadMap(path string, typ ebpf.MapType, k, v uint32) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("socket path: %w", err)
	}
	if m.Type() != typ || m.KeySize() != k || m.ValueSize() != v {
		m.Close()
		return nil, fmt.Errorf("socket path: %s is a %s map with %d/%d-byte keys/values, want %s with %d/%d", path, m.Type(), m.KeySize(), m.ValueSize(), typ, k, v)
	}
	return m, nil
}

// haveNetnsCookie loads, and closes, a program of the socket path's kind
// calling bpf_get_netns_cookie.
func haveNetnsCookie() error {
	return lockedMemory(func() error {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "pm_probe", Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect,
			License: "Apache-2.0", Instructions: asm.Instructions{asm.FnGetNetnsCookie.Call(), asm.Mov.Imm(asm.R0, 1), asm.Return()}})
		if err == nil {
			p.Close()
		}
		return err
	})
}

func (s *kernelSite) Read(netns uint64, f plan.Family) (*State, error) {
	st := &State{Entries: map[Key]Value{}, Owners: map[uint64]plan.Owner{}}
	if !s.Exists() {
		return st, nil
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	keys, vals, err := dump[rawKey, rawValue](s.svc)
	if err != nil {
		return nil, fmt.Errorf("socket path: read %s: %w", s.pin(svcMap), err)
	}
	for i, rk := range keys {
		if k := rk.key(); k.Netns == netns && k.Family() == f {
			st.Entries[k] = vals[i].value()
		}
	}
	oks, recs, err := dump[rawOwnKey, rawOwner](s.owners)
	if err != nil {
		return nil, fmt.Errorf("socket path: read %s: %w", s.pin(ownersMap), err)
	}
	for i, ok := range oks {
		if n, fam, id := ok.parts(); n == netns && fam == f {
			st.Owners[id] = recs[i].owner()
		}
	}
	return st, nil
}

func (s *kernelSite) ReadKeys(netns uint64, f plan.Family, keys []Key, id uint64) (*State, error) {
	st := &State{Entries: map[Key]Value{}, Owners: map[uint64]plan.Owner{}}
	if !s.Exists() {
		return st, nil
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	for _, k := range keys {
		rk := k.raw()
		var rv rawValue
		err := s.svc.Lookup(&rk, &rv)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("socket path: read %s: %w", s.pin(svcMap), err)
		}
		st.Entries[k] = rv.value()
	}
	ok := ownerKeyOf(netns, f, id)
	var rec rawOwner
	switch err := s.owners.Lookup(&ok, &rec); {
	case err == nil:
		st.Owners[id] = rec.owner()
	case !errors.Is(err, ebpf.ErrKeyNotExist):
		return nil, fmt.Errorf("socket path: read %s: %w", s.pin(ownersMap), err)
	}
	return st, nil
}

func (s *kernelSite) Write(netns uint64, f plan.Family, w *Write) error {
	if w.Empty() {
		return nil
	}
	if err := s.open(); err != nil {
		return err
	}
	if len(w.PutOwners) > 0 {
		var ids []rawOwnKey
		var recs []rawOwner
		for id, o := range w.PutOwners {
			ids, recs = append(ids, ownerKeyOf(netns, f, id)), append(recs, ownerEntry(o))
		}
		if err := batchUpdate(s.owners, ids, recs); err != nil {
			return fmt.Errorf("socket path: write owners: %w", err)
		}
	}
	if len(w.Put) > 0 {
		keys, vals := make([]rawKey, len(w.Put)), make([]rawValue, len(w.Put))
		for i, e := range w.Put {
			keys[i], vals[i] = e.Key.raw(), e.Value.raw()
		}
		if err := batchUpdate(s.svc, keys, vals); err != nil {
			return fmt.Errorf("socket path: write entries: %w", err)
		}
	}
	if len(w.Delete) > 0 {
		keys := make([]rawKey, len(w.Delete))
		for i, k := range w.Delete {
			keys[i] = k.raw()
		}
		if err := deleteAll(s.svc, keys); err != nil {
			return fmt.Errorf("socket path: delete entries: %w", err)
		}
	}
	if len(w.DelOwners) > 0 {
		keys := make([]rawOwnKey, len(w.DelOwners))
		for i, id := range w.DelOwners {
			keys[i] = ownerKeyOf(netns, f, id)
		}
		if err := deleteAll(s.owners, keys); err != nil {
			return fmt.Errorf("socket path: delete owners: %w", err)
		}
	}
	return nil
}

// dump reads every element of m, in batches.
func dump[K, V any](m *ebpf.Map) ([]K, []V, error) {
	const chunk = 4096
	var keys []K
	var vals []V
	kb, vb := make([]K, chunk), make([]V, chunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, kb, vb, nil)
		keys, vals = append(keys, kb[:n]...), append(vals, vb[:n]...)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return keys, vals, nil
		}
		if err != nil {
			return nil, nil, err
		}
	}
}

func batchUpdate[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	_, err := m.BatchUpdate(keys, vals, nil)
	return err
}

// deleteAll deletes keys; a key already gone is not an error.
func deleteAll[K any](m *ebpf.Map, keys []K) error {
	for len(keys) > 0 {
		n, err := m.BatchDelete(keys, nil)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		keys = keys[n+1:] // the batch stopped at keys[n], which is gone
	}
	return nil
}
