package socket

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cgroup2Root is the mount point of the root of the cgroup v2 hierarchy
// as the node sees it that this process can reach (a mount hidden under
// a later one is not), or "" when none is mounted.
func cgroup2Root() (string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find the cgroup v2 hierarchy: %w", err)
	}
	for _, at := range cgroup2Roots(string(b)) {
		if t, err := fsType(at); err == nil && t == cgroup2Magic {
			return at, nil
		}
	}
	return "", nil
}

// cgroup2Roots are the mount points of the cgroup v2 mounts in
// mountinfo that show the hierarchy at the cgroup namespace's root or
// above it, highest first. Mountinfo shows a cgroup mount's root
// relative to the reader's cgroup namespace: "/" where the mount's root
// is the namespace's, "/.." per level above it, a path below it. On the
// node that is the hierarchy's root, "/"; in a pod with a cgroup
// namespace of its own (every runtime on a unified hierarchy gives it
// one), the node's mount, reached through the host's / (--root), shows
// as "/../../.." and the pod's own mount as "/": the highest is the
// node's. A mount of a subtree (a path with a name) is not the root.
func cgroup2Roots(mountinfo string) []string {
	type mount struct {
		at     string
		levels int
	}
	var found []mount
	for _, line := range strings.Split(mountinfo, "\n") {
		// id parent major:minor root mountpoint options ... - fstype source super
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 5 || sep+1 >= len(f) || f[sep+1] != "cgroup2" {
			continue
		}
		root := f[3]
		levels := 0
		for rest := root; rest != "/" && rest != ""; levels++ {
			var ok bool
			if rest, ok = strings.CutPrefix(rest, "/.."); !ok {
				levels = -1
				break
			}
		}
		if levels >= 0 {
			found = append(found, mount{unescape(f[4]), levels})
		}
	}
	slices.SortStableFunc(found, func(a, b mount) int { return b.levels - a.levels })
	out := make([]string, len(found))
	for i, m := range found {
		out[i] = m.at
	}
	return out
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash in a path.
func unescape(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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

// readOnly reports whether the filesystem at path is mounted read-only.
func readOnly(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Flags&unix.ST_RDONLY != 0
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

// initMountNS reports whether this process is in the mount namespace of
// the node's init (PID 1 as this process sees it): a mount it makes is
// then the node's. A runtime with a mount namespace of its own would
// mount a bpf filesystem that dies with it, and the links pinned there
// with it. A variable for tests.
var initMountNS = func() (bool, error) {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return false, err
	}
	init, err := os.Readlink("/proc/1/ns/mnt")
	if err != nil {
		return false, err
	}
	return self == init, nil
}

// privateMount reports whether the filesystem at path is mounted in this
// process's mount namespace and not in the node's init's: its device is
// in no line of the init's mount table. Where this process is in the
// init's mount namespace, or cannot tell (no /proc/1 to read: a
// process without CAP_SYS_PTRACE over the init, the agent in its pod),
// it is false.
func privateMount(path string) bool {
	if same, err := initMountNS(); err != nil || same {
		return false
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false
	}
	b, err := os.ReadFile("/proc/1/mountinfo")
	if err != nil {
		return false
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[2] == dev {
			return false
		}
	}
	return true
}

// mountHere says why what (a filesystem the host lacks, where) cannot
// be mounted by this process, or nil where it can: in the mount
// namespace the node's init is in.
func mountHere(what, fix string) error {
	same, err := initMountNS()
	switch {
	case err != nil:
		return fmt.Errorf("socket path: no %s, and whether this process may mount one where the node's init sees it cannot be told (%v): %s", what, err, fix)
	case !same:
		return fmt.Errorf("socket path: no %s where the node's init sees it, and this process runs in a mount namespace of its own, where a mount would die with it: %s", what, fix)
	}
	return nil
}
