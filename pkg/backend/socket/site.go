package socket

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

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
// name.
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
	// Read returns the entries and owner records of family f in the
	// namespace netns.
	Read(netns uint64, f plan.Family) (*State, error)
	// Write applies w to the records of family f in netns: owner records
	// put, entries put, entries deleted, owner records deleted.
	Write(netns uint64, f plan.Family, w *Write) error
	// Hooks reports each hook's link.
	Hooks() ([]HookState, error)
	// Install creates what is missing (pin directory, maps) and brings
	// each hook of states to this build's program on the cgroup.
	Install(states []HookState) error
	// Ready says what this host lacks to install the site, or nil.
	Ready() error
	// Retire removes the site when no entry and no owner record of any
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

// cgroup2Root is the mount point of the host's cgroup v2 hierarchy that
// this process can reach (a mount hidden under a later one is not), or
// "" when none is mounted.
func cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find the cgroup v2 hierarchy: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source super
		fields := strings.Fields(sc.Text())
		for i, x := range fields {
			if x == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 && fields[3] == "/" {
				if t, err := fsType(fields[4]); err == nil && t == cgroup2Magic {
					return fields[4], nil
				}
			}
		}
	}
	return "", sc.Err()
}

// PrivateCgroup2 is where the cgroup v2 hierarchy is mounted for the
// default cgroupPath when the host has none mounted (a cgroup v1 host),
// as Cilium mounts it under /run/cilium/cgroupv2.
const PrivateCgroup2 = "/run/cni-portmap/cgroupv2"

// HostCgroup2 is the root of the host's cgroup v2 hierarchy; when none is
// mounted, it mounts one at at (the hierarchy exists on every kernel with
// cgroup2 support, whatever v1 hierarchies are mounted).
func HostCgroup2(at string) (string, error) {
	root, err := cgroup2Root()
	if err != nil || root != "" {
		return root, err
	}
	if err := os.MkdirAll(at, 0o755); err != nil {
		return "", fmt.Errorf("socket path: %w", err)
	}
	if err := unix.Mount("cgroup2", at, "cgroup2", 0, ""); err != nil {
		return "", fmt.Errorf("socket path: no cgroup v2 hierarchy is mounted and mounting one at %s failed: %w", at, err)
	}
	return at, nil
}

// cgroup2Supported reports whether the kernel has the cgroup2 filesystem.
func cgroup2Supported() bool {
	b, err := os.ReadFile("/proc/filesystems")
	return err == nil && strings.Contains(string(b), "\tcgroup2\n")
}

const (
	bpffsMagic   = 0xcafe4a11
	cgroup2Magic = 0x63677270
)

func fsType(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Type), nil
}

// onBPFFS finds the nearest existing directory of path and reports
// whether it is on a bpf filesystem.
func onBPFFS(path string) (string, bool) {
	for p := path; ; p = filepath.Dir(p) {
		t, err := fsType(p)
		if err == nil {
			return p, t == bpffsMagic
		}
		if p == "/" || p == "." {
			return p, false
		}
	}
}

func (s *kernelSite) pin(name string) string { return filepath.Join(s.dir, name) }

func (s *kernelSite) Exists() bool {
	_, err := os.Stat(s.pin(svcMap))
	return err == nil
}

// Ready says what the host lacks: a cgroup v2 directory at the cgroup
// path, a bpf filesystem under the pin directory, the kernel's cgroup
// socket-address programs with bpf_get_netns_cookie and links, and the
// privilege to load them.
func (s *kernelSite) Ready() error {
	if err := s.resolveCgroup(); err != nil {
		return err
	}
	if s.cgroup == "" {
		if !cgroup2Supported() {
			return errors.New("socket path: the kernel has no cgroup v2 (no cgroup2 in /proc/filesystems)")
		}
		// Install mounts the hierarchy at PrivateCgroup2
	} else if t, err := fsType(s.cgroup); err != nil {
		return fmt.Errorf("socket path: cgroupPath %q: %w", s.cgroup, err)
	} else if t != cgroup2Magic {
		return fmt.Errorf("socket path: cgroupPath %q is not a cgroup v2 directory", s.cgroup)
	}
	if at, ok := onBPFFS(s.dir); !ok && !s.mountsBPFFS() {
		return fmt.Errorf("socket path: bpfPinDir %q is not on a bpf filesystem (%s is not bpffs)", filepath.Dir(s.dir), at)
	}
	if s.Exists() {
		return nil // installed: the kernel and the privilege were there
	}
	if err := features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetNetnsCookie); err != nil {
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
		return nil, fmt.Errorf("socket path: open %s: %w", path, err)
	}
	info, err := m.Info()
	if err == nil && (info.Type != typ || info.KeySize != k || info.ValueSize != v) {
		err = fmt.Errorf("socket path: %s is a %v map of %d/%d-byte keys/values, want %v of %d/%d", path, info.Type, info.KeySize, info.ValueSize, typ, k, v)
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
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

// dump reads every element of m, in batches where the kernel has them.
func dump[K, V any](m *ebpf.Map) ([]K, []V, error) {
	var keys []K
	var vals []V
	const chunk = 4096
	var cursor ebpf.MapBatchCursor
	kb, vb := make([]K, chunk), make([]V, chunk)
	for {
		n, err := m.BatchLookup(&cursor, kb, vb, nil)
		keys, vals = append(keys, kb[:n]...), append(vals, vb[:n]...)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return keys, vals, nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
	}
	keys, vals = nil, nil
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys, vals = append(keys, k), append(vals, v)
	}
	return keys, vals, it.Err()
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
			ids, recs = append(ids, ownerKeyOf(netns, f, id)), append(recs, ownerRecord(o))
		}
		if _, err := s.owners.BatchUpdate(ids, recs, nil); err != nil {
			return fmt.Errorf("socket path: write owners: %w", err)
		}
	}
	if len(w.Put) > 0 {
		keys, vals := make([]rawKey, len(w.Put)), make([]rawValue, len(w.Put))
		for i, e := range w.Put {
			keys[i], vals[i] = e.Key.raw(), e.Value.raw()
		}
		if _, err := s.svc.BatchUpdate(keys, vals, nil); err != nil {
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

// deleteAll deletes keys, one by one where the batch stops at a key
// that is already gone.
func deleteAll[K any](m *ebpf.Map, keys []K) error {
	n, err := m.BatchDelete(keys, nil)
	if err == nil {
		return nil
	}
	for _, k := range keys[n:] {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// resolveCgroup finds the default cgroup path (the root of the host's v2
// hierarchy) when it is first needed: reading the mount table is left to
// the verbs that attach or check links, not to DEL or `portmap list`.
func (s *kernelSite) resolveCgroup() error {
	if s.cgroup != "" {
		return nil
	}
	if s.cfg.CgroupPath != "" {
		s.cgroup = s.cfg.CgroupPath
		return nil
	}
	cg, err := cgroup2Root()
	s.cgroup = cg
	return err
}

func (s *kernelSite) cgroupID() (uint64, error) {
	if err := s.resolveCgroup(); err != nil {
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Stat(s.cgroup, &st); err != nil {
		return 0, fmt.Errorf("socket path: cgroupPath %q: %w", s.cgroup, err)
	}
	return st.Ino, nil
}

func (s *kernelSite) Hooks() ([]HookState, error) {
	if err := s.resolveCgroup(); err != nil {
		return nil, err
	}
	out := make([]HookState, len(Hooks))
	if s.cgroup == "" { // no hierarchy mounted: nothing can be attached; Install mounts one
		for i, h := range Hooks {
			out[i] = HookState{Hook: h, Problem: HookMissing, Detail: "no cgroup v2 hierarchy is mounted"}
		}
		return out, nil
	}
	cg, err := s.cgroupID()
	if err != nil {
		return nil, err
	}
	for i, h := range Hooks {
		out[i] = s.hook(h, cg)
	}
	return out, nil
}

func (s *kernelSite) hook(h Hook, cg uint64) HookState {
	st := HookState{Hook: h}
	l, err := link.LoadPinnedLink(s.pin(h.Name), nil)
	if err != nil {
		st.Problem = HookMissing
		if !errors.Is(err, os.ErrNotExist) {
			st.Detail = err.Error()
		}
		return st
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		st.Problem, st.Detail = HookDetached, err.Error()
		return st
	}
	ci := info.Cgroup()
	switch {
	case ci == nil || ci.CgroupId == 0:
		st.Problem = HookDetached
		return st
	case ci.CgroupId != cg:
		st.Problem, st.Detail = HookMoved, fmt.Sprintf("cgroup id %d, want %d (%s)", ci.CgroupId, cg, s.cgroup)
		return st
	}
	p, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		st.Problem, st.Detail = HookStale, err.Error()
		return st
	}
	defer p.Close()
	pi, err := p.Info()
	if want := progName(h, Version()); err != nil || pi.Name != want {
		st.Problem, st.Detail = HookStale, fmt.Sprintf("program %q, want %q", pi.Name, want)
	}
	return st
}

// Install creates the pin directory and the maps where missing and
// brings each hook of states to this build's program on the cgroup:
// attached where missing, replaced where detached or moved, updated in
// place (the link stays, so no connect() goes unrewritten) where stale.
// The caller holds the host-wide lock.
func (s *kernelSite) Install(states []HookState) error { return s.install(states, Version()) }

// InstallBuild puts programs named as build version on every hook of
// cfg's site (attached where missing, updated in place elsewhere), as
// another build of the plugin would have left them: the kernel tests
// stand for an older or newer build with it.
func InstallBuild(cfg plan.Socket, version string) error {
	site, err := OpenSite(cfg)
	if err != nil {
		return err
	}
	ks := site.(*kernelSite)
	states := make([]HookState, len(Hooks))
	for i, h := range Hooks {
		states[i] = HookState{Hook: h, Problem: HookStale}
		if _, err := os.Stat(ks.pin(h.Name)); err != nil {
			states[i].Problem = HookMissing
		}
	}
	return ks.install(states, version)
}

func (s *kernelSite) install(states []HookState, version string) error {
	if err := s.Ready(); err != nil {
		return err
	}
	if s.mountsBPFFS() {
		if err := unix.Mount("bpffs", bpffsRoot, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("socket path: mount the bpf filesystem at %s: %w", bpffsRoot, err)
		}
	}
	if s.cgroup == "" {
		cg, err := HostCgroup2(PrivateCgroup2)
		if err != nil {
			return err
		}
		s.cgroup = cg
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("socket path: %w", err)
	}
	maps := map[string]*ebpf.Map{}
	for _, ms := range []*ebpf.MapSpec{
		{Name: "pm_svc", Type: ebpf.Hash, KeySize: keySize, ValueSize: valueSize, MaxEntries: svcEntries, Flags: unix.BPF_F_NO_PREALLOC},
		{Name: "pm_rev", Type: ebpf.LRUHash, KeySize: revKeySize, ValueSize: revValSize, MaxEntries: revEntries},
		{Name: "pm_owners", Type: ebpf.Hash, KeySize: ownerKey, ValueSize: ownerSize, MaxEntries: ownersEntries, Flags: unix.BPF_F_NO_PREALLOC},
	} {
		name := strings.TrimPrefix(ms.Name, "pm_")
		m, err := loadMap(s.pin(name), ms.Type, ms.KeySize, ms.ValueSize)
		if errors.Is(err, os.ErrNotExist) {
			if m, err = ebpf.NewMap(ms); err == nil {
				if err = m.Pin(s.pin(name)); err != nil {
					m.Close()
				}
			}
		}
		if err != nil {
			return fmt.Errorf("socket path: map %s: %w", name, err)
		}
		defer m.Close()
		maps[name] = m
	}
	cg, err := os.Open(s.cgroup)
	if err != nil {
		return fmt.Errorf("socket path: %w", err)
	}
	defer cg.Close()
	for _, st := range states {
		if st.Problem == HookOK {
			continue
		}
		if err := s.fix(st, maps[svcMap], maps[revMap], cg, version); err != nil {
			return fmt.Errorf("socket path: %s %s: %w", st.Action(), st.Hook.Name, err)
		}
	}
	return nil
}

func (s *kernelSite) fix(st HookState, svc, rev *ebpf.Map, cg *os.File, version string) error {
	prog, err := ebpf.NewProgram(spec(st.Hook, svc, rev, version))
	if err != nil {
		return err
	}
	defer prog.Close()
	path := s.pin(st.Hook.Name)
	if st.Problem == HookStale {
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			return err
		}
		defer l.Close()
		return l.Update(prog)
	}
	if st.Problem != HookMissing {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	l, err := link.AttachRawLink(link.RawLinkOptions{Target: int(cg.Fd()), Program: prog, Attach: st.Hook.Attach})
	if err != nil {
		return err
	}
	defer l.Close()
	return l.Pin(path)
}

func (s *kernelSite) Retire() (bool, error) {
	if !s.Exists() {
		return false, nil
	}
	if err := s.open(); err != nil {
		return false, err
	}
	var k rawKey
	if err := s.svc.NextKey(nil, &k); err == nil {
		return false, nil // an entry remains
	} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, fmt.Errorf("socket path: read %s: %w", s.pin(svcMap), err)
	}
	var ok rawOwnKey
	if err := s.owners.NextKey(nil, &ok); err == nil {
		return false, nil
	} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, fmt.Errorf("socket path: read %s: %w", s.pin(ownersMap), err)
	}
	return true, s.unpin()
}

// unpin removes every pin of the site: the links (detaching the
// programs, once no process holds them), then the maps, then the layout
// directory and the pin directory when it is empty.
func (s *kernelSite) unpin() error {
	if s.svc != nil {
		s.svc.Close()
		s.owners.Close()
		s.svc, s.owners = nil, nil
	}
	var errs []error
	for _, h := range Hooks {
		errs = append(errs, detachPin(s.pin(h.Name)), removePin(s.pin(h.Name)))
	}
	for _, m := range []string{svcMap, revMap, ownersMap} {
		errs = append(errs, removePin(s.pin(m)))
	}
	errs = append(errs, removePin(s.dir), removePin(filepath.Dir(s.dir)))
	return errors.Join(errs...)
}

// Uninstall removes every pin of cfg's site whatever it holds (tests; an
// operator uses `portmap sync --prune`, which retires a site only when
// no entry remains).
func Uninstall(cfg plan.Socket) error {
	site, err := OpenSite(cfg)
	if err != nil {
		return err
	}
	return site.(*kernelSite).unpin()
}

// detachPin detaches the program of the link pinned at path now: a link
// whose last pin is removed is released by the kernel's deferred work,
// so its program would stay attached (and rewrite connect() calls) for a
// moment after Retire has returned. A link already gone, or a kernel
// without BPF_LINK_DETACH (before 5.9), leaves that to the unpin.
func detachPin(path string) error {
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket path: open %s: %w", path, err)
	}
	defer l.Close()
	if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		return fmt.Errorf("socket path: detach %s: %w", path, err)
	}
	return nil
}

func removePin(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("socket path: %w", err)
	}
	return nil
}
