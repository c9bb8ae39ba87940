//go:build kube

package kube

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/test/nettest"
	"golang.org/x/sys/unix"
)

// The suite's environment: kubeletEnv names the kubelet binary (make
// kube-test builds it from test/kube/kubelet); childEnv marks the run
// inside the node's namespaces; cgroupEnv is the cgroup (in every
// hierarchy) the parent made for the node's pods.
const (
	kubeletEnv = "PORTMAP_KUBELET"
	// containerd2Env names the directory of containerd 2.x's binaries
	// (make kube-test builds them from test/kube/containerd).
	containerd2Env = "PORTMAP_CONTAINERD2"
	childEnv       = "PORTMAP_KUBE_NODE"
	cgroupEnv      = "PORTMAP_KUBE_CGROUP"
	// parentNetEnv is the network namespace the suite was started in,
	// which the node must not be in.
	parentNetEnv = "PORTMAP_KUBE_PARENT_NET"
	// nodeStage is childEnv's value once the node's first process runs
	// in its cgroup namespace (enterCgroupNS).
	nodeStage = "node"
)

// TestMain runs the suite as a node of its own: the test binary re-runs
// itself in new network, mount, PID and cgroup namespaces, where
// containerd, the kubelet, the pods' shims and the pods live and end with
// it. The parent makes the cgroup that is the node's root cgroup (in
// every hierarchy), removes it at the end, and compares what the node
// must not touch (the root namespace's rules, links and sysctls, host
// directories) before and after.
func TestMain(m *testing.M) {
	nettest.RunClientIfAsked() // the socket path's clients, in a test cgroup
	if os.Getenv(childEnv) == peerEnv {
		if err := holdPeer(); err != nil {
			fmt.Fprintf(os.Stderr, "kube: %s: %v\n", peerEnv, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(childEnv) == "1" {
		err := enterCgroupNS() // returns only on failure
		fmt.Fprintf(os.Stderr, "kube: %v\n", err)
		os.Exit(1)
	}
	if os.Getenv(childEnv) == nodeStage {
		if err := setupNode(); err != nil {
			fmt.Fprintf(os.Stderr, "kube: %v\n", err)
			os.Exit(1)
		}
		os.Exit(m.Run())
	}
	nettest.RequireRoot("the kube suite", "it runs containerd and a kubelet in namespaces of its own")
	for _, env := range []string{kubeletEnv, kubeBinEnv, containerd2Env, flanneldEnv, nettest.BinEnv} {
		if os.Getenv(env) == "" {
			if os.Getenv("CI") == "true" {
				fmt.Fprintf(os.Stderr, "kube: %s is not set (make kube-test sets it)\n", env)
				os.Exit(1)
			}
			fmt.Printf("kube: SKIP: %s is not set: run make kube-test\n", env)
			os.Exit(0)
		}
	}
	for _, tool := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "etcd"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "kube: %s is missing (test/deps.sh installs it)\n", tool)
			os.Exit(1)
		}
	}
	before := fingerprint()
	cg := fmt.Sprintf("portmap-kube-%d", os.Getpid())
	made, err := makeCgroup(cg)
	if err != nil {
		removeCgroup(made)
		fmt.Fprintf(os.Stderr, "kube: %v\n", err)
		os.Exit(1)
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	parentNet, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube: %v\n", err)
		os.Exit(1)
	}
	cmd.Env = append(os.Environ(), childEnv+"=1", cgroupEnv+"=/"+cg, parentNetEnv+"="+parentNet)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	status := 0
	if err := cmd.Run(); err != nil {
		status = 1
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() > 0 {
			status = ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "kube: the node ended: %v\n", err)
	}
	// The PID namespace ended with its first process: every process of
	// the node is gone, or going; their cgroups empty out.
	if err := removeCgroup(made); err != nil {
		fmt.Fprintf(os.Stderr, "kube: %v\n", err)
		status = 1
	}
	if d := nettest.Changed(before, fingerprint()); d != "" {
		fmt.Fprintf(os.Stderr, "kube: the node touched the machine:\n%s", d)
		status = 1
	}
	os.Exit(status)
}

// kubeletSysctls are the global sysctls the kubelet sets (its kernel
// defaults, with protectKernelDefaults off): the node shadows them with
// files of its own.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// shadowed are the host directories the node's programs write to (the
// kubelet's fixed paths, containerd's shim sockets, libcni's cache,
// pod logs): the node mounts a tmpfs of its own on each.
var shadowed = []string{"/run", "/var/lib", "/var/log", "/opt", "/etc/cni"}

// fingerprint is what the node must leave as it found it, as text.
func fingerprint() string {
	var files []string
	for _, s := range kubeletSysctls {
		files = append(files, "/proc/sys/"+s)
	}
	// kube-proxy's conntrack settings, left alone by the suite's flags:
	// the table's size is the machine's
	files = append(files, "/proc/sys/net/netfilter/nf_conntrack_max", "/sys/module/nf_conntrack/parameters/hashsize")
	// /run/netns: the names containerd gives (cni-…) and the harness's
	// (cnitest-…), not every other program's namespace
	fp := nettest.Fingerprint(files, []string{"/run/containerd", "/run/netns/cni-*", "/run/netns/cnitest-*", "/run/cni-portmap", "/var/lib/cni", "/var/lib/kubelet",
		"/var/lib/containerd", "/var/log/pods", "/var/log/containers", "/opt/cni", "/etc/cni/net.d", "/usr/libexec/kubernetes"})
	// The suite's own temporary directories (kube-node-, kube-sysctl-,
	// …): other programs share the temporary directory, so only these.
	tmp, err := filepath.Glob(filepath.Join(os.TempDir(), "kube-*"))
	return fp + fmt.Sprintf("temp: %s %v\n", strings.Join(tmp, " "), err)
}

// cgroupHierarchies are the mounted cgroup hierarchies (v1 controllers,
// the named systemd one, the unified one).
func cgroupHierarchies() []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var dirs []string
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		for i, x := range f {
			if x == "-" && i+1 < len(f) && (f[i+1] == "cgroup" || f[i+1] == "cgroup2") {
				dirs = append(dirs, f[4])
			}
		}
	}
	return dirs
}

// makeCgroup makes name under every hierarchy (the kubelet's cgroupRoot
// must exist in each) and returns the directories it made.
func makeCgroup(name string) ([]string, error) {
	var made []string
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, name)
		if err := os.Mkdir(d, 0o755); os.IsExist(err) {
			continue // made through another mount of the same hierarchy
		} else if err != nil {
			return made, fmt.Errorf("make cgroup %s: %w", d, err)
		}
		made = append(made, d)
		if filepath.Base(h) == "cpuset" {
			// A v1 cpuset takes no task until it has CPUs and memory nodes.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err == nil {
					err = os.WriteFile(filepath.Join(d, f), v, 0o644)
				}
				if err != nil {
					return made, fmt.Errorf("cgroup %s: %s: %w", d, f, err)
				}
			}
		}
	}
	return made, nil
}

// removeCgroup removes the cgroups made and everything under them,
// deepest first, waiting up to 30 s for their processes to end.
func removeCgroup(made []string) error {
	var left []string
	for _, top := range made {
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if err = unix.Rmdir(dirs[i]); err == nil || os.IsNotExist(err) || time.Now().After(end) {
					break
				}
			}
			if err != nil && !os.IsNotExist(err) {
				left = append(left, fmt.Sprintf("%s: %v", dirs[i], err))
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("cgroups left: %s", strings.Join(left, "; "))
	}
	return nil
}

// setupNode prepares the node's namespaces (this process is the first of
// its PID namespace, and in its cgroup namespace): mounts private; a
// sysfs of this network namespace with the cgroup hierarchies mounted
// from this cgroup namespace and a bpf filesystem of its own; a /proc of this
// PID namespace with the kubelet's global sysctls shadowed by files; a
// tmpfs on each shadowed host directory; loopback up.
func setupNode() error {
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil || self == os.Getenv(parentNetEnv) {
		return fmt.Errorf("refusing to run: not in a network namespace of its own (%s %v)", self, err)
	}
	// At the root of a cgroup namespace in every hierarchy (enterCgroupNS):
	// "/" is the suite's cgroup, not the machine's root.
	cgroups, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	for _, l := range strings.Fields(string(cgroups)) {
		if !strings.HasSuffix(l, ":/") {
			return fmt.Errorf("refusing to run: not at the root of a cgroup namespace of its own (%s)", l)
		}
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// The machine's hierarchies, read before sysfs is replaced; mounted
	// again from this cgroup namespace, each shows the suite's cgroup as
	// its root, as a node's own hierarchies show the node's root.
	layout, err := cgroupMounts()
	if err != nil {
		return err
	}
	// The machine's sysfs and what is mounted under it leave this mount
	// namespace (a mount over them would hide them, not remove them from
	// mountinfo, where a program looking for cgroup2 mounts would still
	// find the machine's).
	if err := unix.Unmount("/sys", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount the machine's /sys: %w", err)
	}
	if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return fmt.Errorf("mount sysfs: %w", err)
	}
	if err := mountCgroups(layout); err != nil {
		return err
	}
	// The bpf filesystem a node's init mounts (systemd does), where the
	// socket path pins by default: this one is the node's and ends with
	// its mount namespace.
	if err := unix.Mount("bpffs", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	shadows, err := os.MkdirTemp("", "kube-sysctl-")
	if err != nil {
		return err
	}
	for _, s := range kubeletSysctls {
		v, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			return err
		}
		f := filepath.Join(shadows, strings.ReplaceAll(s, "/", "."))
		if err := os.WriteFile(f, v, 0o644); err != nil {
			return err
		}
		if err := unix.Mount(f, "/proc/sys/"+s, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("shadow %s: %w", s, err)
		}
	}
	// The bind mounts hold the files; the machine's /tmp keeps nothing
	// of the node (it is not shadowed, so the directory was left there
	// after every run).
	if err := os.RemoveAll(shadows); err != nil {
		return err
	}
	for _, d := range shadowed {
		if _, err := os.Stat(d); err != nil {
			return fmt.Errorf("%s: %w (the node shadows it, it does not make it)", d, err)
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("mount a tmpfs on %s: %w", d, err)
		}
	}
	// Shared within the node's mount namespace, as on a systemd host:
	// containerd requires it of a HostToContainer volume (the DaemonSet's
	// /host). Made private first, so nothing propagates to the machine.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make mounts shared: %w", err)
	}
	nettest.MarkIsolated()
	return nettest.SetupNetNS()
}

// enterCgroupNS is the node's first stage: its first process joins the
// suite's cgroup in every hierarchy, takes a cgroup namespace rooted
// there and runs the suite again in it (the namespace is the calling
// thread's; the exec makes it the process's). The node then sees the
// suite's cgroup as the root, as a node sees its own: the socket path's
// default site, a hierarchy's root, is the suite's cgroup and no more.
func enterCgroupNS() error {
	cg := os.Getenv(cgroupEnv)
	if strings.Trim(cg, "/") == "" {
		// the machine's root: the node joins only a cgroup the suite made
		return fmt.Errorf("refusing to run: %s=%q names no cgroup of the suite's", cgroupEnv, cg)
	}
	for _, h := range cgroupHierarchies() {
		procs := filepath.Join(h, cg, "cgroup.procs")
		if err := os.WriteFile(procs, []byte("0"), 0o644); err != nil {
			return fmt.Errorf("join %s: %w", procs, err)
		}
	}
	goruntime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("new cgroup namespace: %w", err)
	}
	env := []string{childEnv + "=" + nodeStage, cgroupEnv + "=/"}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != childEnv && k != cgroupEnv {
			env = append(env, kv)
		}
	}
	return syscall.Exec("/proc/self/exe", os.Args, env)
}

// cgroupLayout is the machine's /sys/fs/cgroup: its hierarchies (where,
// the type and the options that name one: v1 controllers, name=systemd)
// and the symbolic links beside them (cpu -> cpu,cpuacct).
type cgroupLayout struct {
	mounts []cgroupMount
	links  map[string]string
}

type cgroupMount struct{ at, fstype, opts string }

// cgroupMounts reads the machine's cgroup layout.
func cgroupMounts() (*cgroupLayout, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil, err
	}
	links := map[string]string{}
	for _, e := range entries {
		if e.Type()&os.ModeSymlink != 0 {
			if links[e.Name()], err = os.Readlink(filepath.Join("/sys/fs/cgroup", e.Name())); err != nil {
				return nil, err
			}
		}
	}
	var ms []cgroupMount
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		sep := slices.Index(f, "-")
		if sep < 5 || sep+3 >= len(f) || (f[sep+1] != "cgroup" && f[sep+1] != "cgroup2") || !strings.HasPrefix(f[4], "/sys/fs/cgroup") {
			continue
		}
		var opts []string
		for _, o := range strings.Split(f[sep+3], ",") {
			if o != "rw" && o != "ro" {
				opts = append(opts, o)
			}
		}
		ms = append(ms, cgroupMount{f[4], f[sep+1], strings.Join(opts, ",")})
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	return &cgroupLayout{ms, links}, nil
}

// mountCgroups mounts each hierarchy again at its place under the new
// sysfs: on a tmpfs at /sys/fs/cgroup unless the unified hierarchy is
// mounted there itself, with the machine's links beside them.
func mountCgroups(l *cgroupLayout) error {
	ms := l.mounts
	if !slices.ContainsFunc(ms, func(m cgroupMount) bool { return m.at == "/sys/fs/cgroup" }) {
		if err := unix.Mount("tmpfs", "/sys/fs/cgroup", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
			return fmt.Errorf("mount a tmpfs on /sys/fs/cgroup: %w", err)
		}
	}
	for _, m := range ms {
		if err := os.MkdirAll(m.at, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, m.at, m.fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, m.opts); err != nil {
			return fmt.Errorf("mount %s (%s) at %s: %w", m.fstype, m.opts, m.at, err)
		}
	}
	for name, to := range l.links {
		if err := os.Symlink(to, filepath.Join("/sys/fs/cgroup", name)); err != nil {
			return err
		}
	}
	// Every cgroup mount left shows the node's root or below it: none of
	// the machine's, above it ("/.."), where the socket path's default
	// site would be the machine's root cgroup.
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if sep := slices.Index(f, "-"); sep > 4 && sep+1 < len(f) && strings.HasPrefix(f[sep+1], "cgroup") && strings.HasPrefix(f[3], "/..") {
			return fmt.Errorf("a cgroup mount above the node's root is left: %s", line)
		}
	}
	return nil
}
