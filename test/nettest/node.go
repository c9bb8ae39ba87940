package nettest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"
)

// Node is a node whose socket path lives at its default sites, as a
// DaemonSet's pod finds it, made of the test's own cgroup and bpf
// filesystem: the root of its cgroup v2 hierarchy is a child cgroup of
// the test's, mounted from a cgroup namespace rooted there (so the
// node's processes see the mount as the hierarchy's root), and a bpf
// filesystem of the test's is mounted at /sys/fs/bpf of the test's mount
// namespace. The plugin runs in the node's cgroup namespace; the agent
// runs as the DaemonSet runs it (AgentAsPod). Nothing is attached to a
// cgroup but the test's; everything goes when the test ends.
type Node struct {
	// Site runs clients in the node's root cgroup (the test's child);
	// its PinDir is the default one.
	Site *CgroupSite
	// Cgroup is where the node's hierarchy is mounted.
	Cgroup string
	dir    string
	bin    string // the plugin's wrapper
	init   *exec.Cmd
}

// NewNode makes the node. Only one lives at a time (it mounts
// /sys/fs/bpf of the test's mount namespace).
func NewNode(tb TB) *Node {
	tb.Helper()
	if !Isolated() {
		tb.Fatalf("nodes are made only in the isolated mount namespace of nettest.Main")
	}
	n := &Node{dir: tb.TempDir()}
	real := filepath.Join(n.dir, "cgroup2")
	n.Cgroup, n.bin = filepath.Join(n.dir, "node-cgroup"), filepath.Join(n.dir, "bin")
	for _, d := range []string{real, n.Cgroup, n.bin, filepath.Join(n.dir, "host")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	// The hierarchy, to make the node's cgroup and, at the end, remove
	// it; held by a descriptor only, so that no process of the node sees
	// its root.
	if err := unix.Mount("cgroup2", real, "cgroup2", 0, ""); err != nil {
		tb.Fatalf("mount cgroup2 at %s: %v", real, err)
	}
	top, err := unix.Open(real, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Unmount(real, unix.MNT_DETACH); err != nil {
		tb.Fatal(err)
	}
	name := fmt.Sprintf("portmap-node-%d-%d", os.Getpid(), time.Now().UnixNano())
	if err := unix.Mkdirat(top, name, 0o755); err != nil {
		tb.Fatalf("make the node's cgroup: %v", err)
	}
	tb.Cleanup(func() {
		defer unix.Close(top)
		for _, d := range []string{name + "/agent", name} {
			var err error
			for i := 0; i < 100; i++ {
				if err = unix.Unlinkat(top, d, unix.AT_REMOVEDIR); err == nil || err == unix.ENOENT {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil && err != unix.ENOENT {
				tb.Errorf("remove the node's cgroup %s: %v", d, err)
			}
		}
	})
	if err := unix.Mkdirat(top, name+"/agent", 0o755); err != nil {
		tb.Fatal(err)
	}
	cgfd, err := unix.Openat(top, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	// The node's init: a cgroup namespace rooted at the node's cgroup,
	// from which the hierarchy is mounted (its root shows as "/" there).
	n.init = exec.Command("unshare", "--cgroup", "--", "sh", "-c", `mount -t cgroup2 cgroup2 "$1" && echo up && exec sleep 3600`, "sh", n.Cgroup)
	n.init.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgfd}
	n.init.Stderr = os.Stderr
	out, err := n.init.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	err = n.init.Start()
	unix.Close(cgfd)
	if err != nil {
		tb.Fatalf("start the node's init: %v", err)
	}
	tb.Cleanup(func() {
		_ = n.init.Process.Kill()
		_ = n.init.Wait()
		if err := unix.Unmount(n.Cgroup, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount the node's cgroup: %v", err)
		}
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "up\n" {
		tb.Fatalf("the node's init: %q %v", line, err)
	}
	// A bpf filesystem where the socket path pins by default; unmounted
	// (the links with it, which detaches the programs) before the
	// cgroup goes.
	if err := unix.Mount("bpffs", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		tb.Fatalf("mount bpffs at /sys/fs/bpf: %v", err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount("/sys/fs/bpf", unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount the node's bpffs: %v", err)
		}
	})
	n.Site = &CgroupSite{Cgroup: n.Cgroup, PinDir: "/sys/fs/bpf/cni-portmap", BPFFS: "/sys/fs/bpf"}
	wrapper := fmt.Sprintf("#!/bin/sh\nexec nsenter --target %d --cgroup -- %s \"$@\"\n", n.init.Process.Pid, filepath.Join(BinDir(), "portmap"))
	if err := os.WriteFile(filepath.Join(n.bin, "portmap"), []byte(wrapper), 0o755); err != nil {
		tb.Fatal(err)
	}
	return n
}

// Runtime is NewRuntimeWithCache whose portmap plugin runs in the node's
// cgroup namespace.
func (n *Node) Runtime(tb TB, net Net, cacheDir string) *Runtime {
	tb.Helper()
	rt := NewRuntimeWithCache(tb, net, cacheDir)
	rt.CNI = libcni.NewCNIConfigWithCacheDir([]string{n.bin, BinDir()}, cacheDir, nil)
	return rt
}

// AgentAsPod runs portmap-agent as the DaemonSet's container runs it: in
// a cgroup of its own below the node's root, in a cgroup namespace
// rooted there, in a mount namespace of its own with the node's /
// bind-mounted and given as --root (appended to args), with exactly the
// capabilities caps in its bounding set (setpriv; nil: all).
func (n *Node) AgentAsPod(caps []string, args ...string) (stdout, stderr string, status int, err error) {
	cmd, done, err := n.asPod(caps, args)
	if err != nil {
		return "", "", 0, err
	}
	defer done()
	return runAgent(cmd)
}

// WatchAsPod is StartWatch of `portmap-agent sync --watch args` run as
// AgentAsPod runs the agent.
func (n *Node) WatchAsPod(tb LogTB, caps []string, started string, args ...string) *Watcher {
	tb.Helper()
	cmd, done, err := n.asPod(caps, append([]string{"sync", "--watch"}, args...))
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Env = PluginEnv("", "", "", "")
	w := startWatch(tb, cmd, true, started)
	done()
	return w
}

// AgentPodCommand is the command AgentAsPod runs, not started, for a
// test that starts it itself (to kill it midway); done closes what
// starting it needed, once it has started.
func (n *Node) AgentPodCommand(caps []string, args ...string) (cmd *exec.Cmd, done func(), err error) {
	cmd, done, err = n.asPod(caps, args)
	if err == nil {
		cmd.Env = PluginEnv("", "", "", "")
	}
	return cmd, done, err
}

// asPod is the command that runs portmap-agent with args as the
// DaemonSet's container runs it (AgentAsPod); done closes what starting
// it needed.
func (n *Node) asPod(caps, args []string) (cmd *exec.Cmd, done func(), err error) {
	host := filepath.Join(n.dir, "host")
	argv := append([]string{"unshare", "--cgroup", "--mount", "--", "sh", "-c",
		`h=$1; shift; mount --rbind / "$h" && mount --make-rslave "$h" && exec "$@"`, "sh", host},
		withCaps(caps)...)
	argv = append(append(argv, filepath.Join(BinDir(), "portmap-agent")), args...)
	argv = append(argv, "--root", host)
	cg, err := os.Open(filepath.Join(n.Cgroup, "agent"))
	if err != nil {
		return nil, nil, err
	}
	cmd = exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	return cmd, func() { cg.Close() }, nil
}
