package socket

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// resolveCgroup finds the default cgroup path (the root of the host's v2
// hierarchy) when it is first needed: reading the mount table is left to
// the verbs that attach or check links, not to DEL or `portmap-agent list`.
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
		if out[i], err = s.hook(h, cg); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hook judges h's link from the pins alone: the link's cgroup and
// program, and the program pinned beside it, whose name carries the
// build. Nothing is loaded, and no program is looked up by its ID (which
// takes CAP_SYS_ADMIN): an agent with CAP_BPF finds a steady site steady.
// A link whose program is not pinned beside it (a build that did not pin
// programs, a pin lost) is stale: updating it pins the program.
// The kernel's refusal to open a pin is an error, not a missing link.
func (s *kernelSite) hook(h Hook, cg uint64) (HookState, error) {
	st := HookState{Hook: h}
	l, err := link.LoadPinnedLink(s.pin(h.Name), nil)
	if denied(err) {
		return st, fmt.Errorf("socket path: open %s: %w", s.pin(h.Name), err)
	}
	if err != nil {
		st.Problem = HookMissing
		if !errors.Is(err, os.ErrNotExist) {
			st.Detail = err.Error()
		}
		return st, nil
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		st.Problem, st.Detail = HookDetached, err.Error()
		return st, nil
	}
	on := info.Cgroup()
	switch {
	case info.Type != link.CgroupType || on == nil || on.CgroupId == 0:
		st.Problem = HookDetached
		return st, nil
	case on.CgroupId != cg:
		st.Problem, st.Detail = HookMoved, fmt.Sprintf("cgroup id %d, want %d (%s)", on.CgroupId, cg, s.cgroup)
		return st, nil
	}
	p, err := ebpf.LoadPinnedProgram(s.pin(progPin(h)), nil)
	switch {
	case denied(err):
		return st, fmt.Errorf("socket path: open %s: %w", s.pin(progPin(h)), err)
	case errors.Is(err, os.ErrNotExist):
		st.Problem, st.Detail = HookStale, "program not pinned"
		return st, nil
	case err != nil:
		st.Problem, st.Detail = HookStale, err.Error()
		return st, nil
	}
	defer p.Close()
	pi, err := p.Info()
	if err != nil {
		st.Problem, st.Detail = HookStale, err.Error()
		return st, nil
	}
	if id, _ := pi.ID(); id != info.Program {
		st.Problem, st.Detail = HookStale, fmt.Sprintf("the link runs program %d, %d is pinned", info.Program, id)
	} else if want := progName(h, Revision, Version()); pi.Name != want {
		if r, ok := revisionOf(pi.Name); ok && r > Revision {
			// a newer build's, met in a rolling update: its to keep
			st.Detail = fmt.Sprintf("program %q of a newer revision", pi.Name)
			return st, nil
		}
		st.Problem, st.Detail = HookStale, fmt.Sprintf("program %q, want %q", pi.Name, want)
	}
	return st, nil
}

// denied reports whether err is the kernel's refusal for want of a
// privilege.
func denied(err error) bool { return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) }

// Install creates the pin directory and the maps where missing and
// brings each hook of states to this build's program on the cgroup:
// attached where missing, replaced where detached or moved, updated in
// place (the link stays, so no connect() goes unrewritten) where stale.
// The caller holds the host-wide lock.
func (s *kernelSite) Install(states []HookState) error {
	return s.install(states, Revision, Version())
}

// InstallBuild puts programs named as a build of revision and version
// on every hook of cfg's site (attached where missing, updated in place
// elsewhere), as another build of the plugin would have left them: the
// kernel tests stand for an older or newer build with it.
func InstallBuild(cfg plan.Socket, revision int, version string) error {
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
	return ks.install(states, revision, version)
}

func (s *kernelSite) install(states []HookState, revision int, version string) error {
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
			if err = lockedMemory(func() (err error) { m, err = ebpf.NewMap(ms); return err }); err == nil {
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
		if err := s.fix(st, maps[svcMap], maps[revMap], cg, revision, version); err != nil {
			return fmt.Errorf("socket path: %s %s: %w", st.Action(), st.Hook.Name, err)
		}
	}
	return nil
}

func (s *kernelSite) fix(st HookState, svc, rev *ebpf.Map, cg *os.File, revision int, version string) error {
	var prog *ebpf.Program
	err := lockedMemory(func() (err error) {
		prog, err = ebpf.NewProgram(spec(st.Hook, svc, rev, revision, version))
		return err
	})
	if err != nil {
		return err
	}
	defer prog.Close()
	if err := s.attach(st, prog, cg); err != nil {
		return err
	}
	return pinAs(prog, s.pin(progPin(st.Hook)))
}

// attach puts prog on st's hook: the pinned link updated in place where
// stale, else a new link pinned in its place.
func (s *kernelSite) attach(st HookState, prog *ebpf.Program, cg *os.File) error {
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

// pinAs pins prog at path in one step, replacing what is pinned there:
// a reader finds the old program or the new one, never none.
func pinAs(prog *ebpf.Program, path string) error {
	tmp := path + "_new"
	if err := removePin(tmp); err != nil {
		return err
	}
	if err := prog.Pin(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, removePin(tmp))
	}
	return nil
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
		errs = append(errs, detachPin(s.pin(h.Name)), removePin(s.pin(h.Name)), removePin(s.pin(progPin(h))))
	}
	for _, m := range []string{svcMap, revMap, ownersMap} {
		errs = append(errs, removePin(s.pin(m)))
	}
	errs = append(errs, removePin(s.dir), removePin(filepath.Dir(s.dir)))
	return errors.Join(errs...)
}

// Uninstall removes every pin of cfg's site whatever it holds (tests; an
// operator uses `portmap-agent sync --prune`, which retires a site only when
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
		return fmt.Errorf("socket path: %w", err)
	}
	defer l.Close()
	if err := l.Detach(); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, ebpf.ErrNotSupported) {
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

// lockedMemory runs create, a map's or program's creation, and where the
// kernel refuses it with EPERM while RLIMIT_MEMLOCK is finite runs it
// again once with the limit lifted: to no limit, or without
// CAP_SYS_RESOURCE to the hard limit. Kernels before 5.11 charge BPF
// memory to the creator's RLIMIT_MEMLOCK (often 64 KiB, or 8 MiB under
// systemd); from 5.11 the memory cgroup counts it. cilium/ebpf's
// rlimit.RemoveMemlock does the same ahead of time, but its package
// creates a map at every start of the binary to learn which kernel it
// is on.
func lockedMemory(create func() error) error {
	err := create()
	if !errors.Is(err, unix.EPERM) {
		return err
	}
	var cur unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &cur) != nil {
		return err
	}
	for _, lim := range []unix.Rlimit{{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}, {Cur: cur.Max, Max: cur.Max}} {
		if cur.Cur != unix.RLIM_INFINITY && (lim.Cur == unix.RLIM_INFINITY || lim.Cur > cur.Cur) && unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil {
			return create()
		}
	}
	return err
}
