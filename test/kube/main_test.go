//go:build kube

package kube

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
)

// TestMain runs the suite as a node of its own: the test binary re-runs
// itself in new network, mount and PID namespaces, where containerd, the
// kubelet, the pods' shims and the pods live and end with it. The parent
// makes the cgroup the kubelet puts pods under, removes it at the end,
// and compares what the node must not touch (the root namespace's rules,
// links and sysctls, host directories) before and after.
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
// its PID namespace): mounts private; a sysfs of this network namespace
// with the machine's cgroup hierarchies moved under it; a /proc of this
// PID namespace with the kubelet's global sysctls shadowed by files; a
// tmpfs on each shadowed host directory; loopback up.
func setupNode() error {
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil || self == os.Getenv(parentNetEnv) {
		return fmt.Errorf("refusing to run: not in a network namespace of its own (%s %v)", self, err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	keep, err := os.MkdirTemp("", "kube-cgroup-")
	if err != nil {
		return err
	}
	if err := unix.Mount("/sys/fs/cgroup", keep, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("keep the cgroup mounts: %w", err)
	}
	if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return fmt.Errorf("mount sysfs: %w", err)
	}
	if err := unix.Mount(keep, "/sys/fs/cgroup", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the cgroup mounts back: %w", err)
	}
	_ = os.Remove(keep)
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
	// The node is in the machine's cgroup namespace: a plugin asked for
	// the socket path at its default site would mount the cgroup v2
	// hierarchy at PrivateCgroup2 and attach at the machine's root. A
	// file where that mount would go makes such an ADD fail instead (the
	// suite's socket-path nodes name a cgroup of the test's).
	if err := os.MkdirAll("/run/cni-portmap", 0o755); err != nil {
		return err
	}
	if err := os.WriteFile("/run/cni-portmap/cgroupv2", []byte("no cgroup v2 mount here: the machine's hierarchy is not the node's\n"), 0o444); err != nil {
		return err
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
