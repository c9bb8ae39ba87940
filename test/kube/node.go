//go:build kube

package kube

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/portmap-dev/portmap/test/nettest"
)

// Images of the suite, imported into containerd's k8s.io namespace.
const (
	pauseImage  = "localhost/kube-test/pause:1"
	serverImage = "localhost/kube-test/server:1"
)

// node is containerd and a kubelet (standalone: static pods from a
// directory, no API server) in the suite's namespaces, with the CNI
// directories containerd uses.
type node struct {
	name      string // its Kubernetes name
	dir       string // everything of the node's own
	cniBin    string // containerd's CNI bin_dir
	cniConf   string // containerd's CNI conf_dir
	sock      string // containerd's socket
	manifests string // the kubelet's static pod directory
	cgroup    string // the kubelet's cgroupRoot

	rt                  runtime
	containerd, kubelet *exec.Cmd
	// kubeletArgs are the kubelet's flags beyond its configuration (its
	// API server's, in a cluster).
	kubeletArgs []string
	// control is the cluster's control plane, in the order it started.
	control []*exec.Cmd
	// peer is the process holding a second node's namespaces (see
	// startPeerNode), netNS its network namespace; nil for the node of the
	// suite's own namespaces.
	peer  *exec.Cmd
	netNS ns.NetNS
	// kubeconfig is how the node's programs reach the API server; link is
	// its LAN link in a cluster of two nodes.
	kubeconfig, link string
}

// runtime is a container runtime the suite runs pods with.
type runtime struct {
	name string
	// bin is the directory of its containerd, containerd-shim-runc-v2
	// and ctr; empty for the ones on PATH (Debian's).
	bin string
	// config is its configuration, formatted with: root, state, socket,
	// sandbox image, CNI bin directory, CNI conf directory.
	config string
	// cniVersion is the conflist's: 1.1.0 where the runtime's libcni
	// knows it (and calls STATUS for it).
	cniVersion string
}

// containerd16 is Debian's containerd; containerd2 is containerd 2.x,
// built from the Go module proxy at the release test/kube/containerd
// pins (make kube-test).
var (
	containerd16 = runtime{name: "containerd-1.6", config: containerdConfig, cniVersion: "1.0.0"}
	containerd2  = runtime{name: "containerd-2", bin: os.Getenv(containerd2Env), config: containerd2Config, cniVersion: "1.1.0"}
)

func (r runtime) path(prog string) string {
	if r.bin == "" {
		return prog
	}
	return filepath.Join(r.bin, prog)
}

// startNode starts the runtime with images of the suite imported and a
// standalone kubelet, and stops both when the test ends.
func startNode(t *testing.T, rt runtime) *node {
	t.Helper()
	n := prepareNode(t, rt)
	n.startKubelet(t)
	return n
}

// startClusterNode starts the runtime, a cluster's control plane and a
// kubelet that registers the node as node1 with the node's LAN address.
func startClusterNode(t *testing.T, rt runtime, nodeIP string) (*node, *controlPlane) {
	t.Helper()
	n := prepareNode(t, rt)
	c := startControlPlane(t, n, nodeIP)
	n.kubeconfig = c.kubeconfig
	n.kubeletArgs = []string{"--kubeconfig", c.kubeconfig, "--node-ip", nodeIP}
	n.startKubelet(t)
	return n, c
}

// prepareNode starts the runtime with the suite's images imported, the
// CNI directories made and the CNI plugins in place.
func prepareNode(t *testing.T, rt runtime) *node {
	t.Helper()
	return prepare(t, &node{name: "node1", cgroup: os.Getenv(cgroupEnv), rt: rt})
}

// prepare fills in n's directories, starts its runtime with the suite's
// images imported and puts the CNI plugins in place.
func prepare(t *testing.T, n *node) *node {
	t.Helper()
	dir, err := os.MkdirTemp("", "kube-node-")
	if err != nil {
		t.Fatal(err)
	}
	n.dir = dir
	n.cniBin, n.cniConf = "/opt/cni/bin", "/etc/cni/net.d"
	n.sock, n.manifests = filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "manifests")
	t.Cleanup(func() {
		n.stop(t)
		if t.Failed() {
			n.keepLogs(t)
		}
		os.RemoveAll(dir)
	})
	for _, d := range []string{n.at(n.cniBin), n.at(n.cniConf), n.manifests} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		copyFile(t, filepath.Join(nettest.BinDir(), p), filepath.Join(n.at(n.cniBin), p))
	}
	n.startContainerd(t)
	n.importImages(t)
	return n
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to+".tmp", data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(to+".tmp", to); err != nil {
		t.Fatal(err)
	}
}

// The containerd 1.6 configuration: CRI with our CNI directories and
// sandbox image; restrict_oom_score_adj because runc may not lower a
// score without CAP_SYS_RESOURCE; runc through runcCgroupNS.
const containerdConfig = `version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %q
`

// The containerd 2.x configuration (version 3): the same, in the CRI
// plugin's new layout.
const containerd2Config = `version = 3
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %q
`

// runcCgroupNS is the runc containerd runs: runc, with a cgroup
// namespace of its own for every container, as containerd's CRI gives
// one on a unified hierarchy (every current distribution). On this
// suite's machines (cgroup v1 beside v2) the CRI asks for none, and a pod
// would see the node's cgroups as the node does: the DaemonSet's agent
// must find the node's hierarchy from a namespace of its own, as it does
// on real nodes.
const runcCgroupNS = `#!/bin/sh
bundle= prev= sub=
for a in "$@"; do
	case $prev in --bundle|-b) bundle=$a ;; esac
	case $a in create|run) [ -z "$sub" ] && sub=$a ;; esac
	prev=$a
done
if [ -n "$sub" ] && [ -n "$bundle" ] && ! grep -q '"namespaces":\\[[^]]*"type":"cgroup"' "$bundle/config.json"; then
	sed -i 's/"namespaces":\[/"namespaces":[{"type":"cgroup"},/' "$bundle/config.json"
fi
exec runc "$@"
`

func (n *node) startContainerd(t *testing.T) {
	t.Helper()
	cfg := filepath.Join(n.dir, "containerd.toml")
	runc := filepath.Join(n.dir, "runc-cgroupns")
	if err := os.WriteFile(runc, []byte(runcCgroupNS), 0o755); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf(n.rt.config, filepath.Join(n.dir, "containerd"), filepath.Join(n.dir, "containerd-state"),
		n.sock, pauseImage, n.cniBin, n.cniConf, runc)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	n.containerd = n.daemon(t, "containerd", n.rt.path("containerd"), "--config", cfg)
	if !nettest.Eventually(30*time.Second, func() bool { return n.ctr("version") == nil }) {
		t.Fatalf("containerd did not answer in 30 s:\n%s", n.log("containerd"))
	}
}

// daemon starts a long-running program of the node, its output in a log
// file of its own.
func (n *node) daemon(t *testing.T, name, path string, args ...string) *exec.Cmd {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(n.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := n.command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if n.rt.bin != "" { // the runtime's own shim first
		cmd.Env = append(os.Environ(), "PATH="+n.rt.bin+":"+os.Getenv("PATH"))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return cmd
}

// keepLogs copies the daemons' logs where they outlive the node and says
// where.
func (n *node) keepLogs(t *testing.T) {
	keep, err := os.MkdirTemp("", "kube-logs-")
	if err != nil {
		t.Log(err)
		return
	}
	logs, _ := filepath.Glob(filepath.Join(n.dir, "*.log"))
	for _, l := range logs {
		if data, err := os.ReadFile(l); err == nil {
			_ = os.WriteFile(filepath.Join(keep, filepath.Base(l)), data, 0o644)
		}
	}
	t.Logf("the node's logs are kept in %s", keep)
}

// log is the tail of a daemon's log.
func (n *node) log(name string) string {
	data, _ := os.ReadFile(filepath.Join(n.dir, name+".log"))
	if len(data) > 6000 {
		data = data[len(data)-6000:]
	}
	return string(data)
}

// logMark is where a daemon's log ends now, for logHas.
func (n *node) logMark(name string) int {
	data, _ := os.ReadFile(filepath.Join(n.dir, name+".log"))
	return len(data)
}

// logHas reports whether a daemon's log holds s after mark.
func (n *node) logHas(name string, mark int, s string) bool {
	data, _ := os.ReadFile(filepath.Join(n.dir, name+".log"))
	return len(data) > mark && bytes.Contains(data[mark:], []byte(s))
}

// tasks lists the running tasks of containerd's k8s.io namespace (the
// pods' containers and sandboxes).
func (n *node) tasks() []string {
	if n.containerd == nil {
		return nil
	}
	out, err := exec.Command(n.rt.path("ctr"), "--address", n.sock, "--namespace", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		return nil
	}
	var ids []string
	for _, l := range strings.Split(string(out), "\n")[1:] {
		if f := strings.Fields(l); len(f) >= 3 && f[2] == "RUNNING" {
			ids = append(ids, f[0])
		}
	}
	return ids
}

func (n *node) ctr(args ...string) error {
	out, err := exec.Command(n.rt.path("ctr"), append([]string{"--address", n.sock, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// importImages builds the suite's images from the static podserver and
// imports them.
func (n *node) importImages(t *testing.T) {
	t.Helper()
	bin := filepath.Join(n.dir, "podserver")
	build := exec.Command("go", "build", "-o", bin, "./podserver")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build podserver: %v\n%s", err, out)
	}
	for _, img := range []struct{ name, entry string }{{pauseImage, "pause"}, {serverImage, "serve"}} {
		archive := filepath.Join(n.dir, img.entry+".tar")
		entry := []string{"/podserver"}
		if img.entry == "pause" {
			entry = append(entry, "pause")
		}
		if err := ociArchive(archive, img.name, map[string]string{"/podserver": bin}, entry, nil); err != nil {
			t.Fatal(err)
		}
		if err := n.ctr("images", "import", archive); err != nil {
			t.Fatal(err)
		}
	}
}

// The kubelet's configuration: standalone, cgroupfs under the suite's
// cgroup, static pods polled every second, its own dirs for volume
// plugins and pod logs, oomScoreAdj 0 (no CAP_SYS_RESOURCE needed).
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %q
fileCheckFrequency: 1s
syncFrequency: 5s
containerRuntimeEndpoint: %q
cgroupDriver: cgroupfs
cgroupRoot: %q
failSwapOn: false
oomScoreAdj: 0
address: 127.0.0.1
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
volumePluginDir: %q
podLogsDir: /var/log/pods
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
`

func (n *node) startKubelet(t *testing.T) {
	t.Helper()
	cfg := filepath.Join(n.dir, "kubelet.yaml")
	text := fmt.Sprintf(kubeletConfig, n.manifests, "unix://"+n.sock, n.cgroup, filepath.Join(n.dir, "volume-plugins"))
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--config", cfg, "--hostname-override", n.name, "--v", "2"}, n.kubeletArgs...)
	n.kubelet = n.daemon(t, "kubelet", os.Getenv(kubeletEnv), args...)
	if n.peer != nil {
		return // its 127.0.0.1 is not this one's: the cluster says when it is Ready
	}
	if !nettest.Eventually(60*time.Second, func() bool { return httpOK("http://127.0.0.1:10248/healthz") }) {
		t.Fatalf("the kubelet was not healthy in 60 s:\n%s", n.log("kubelet"))
	}
}

// restart ends a daemon of the node (SIGTERM, then SIGKILL) and starts it
// again; the pods go on running.
func (n *node) restart(t *testing.T, which string) {
	t.Helper()
	switch which {
	case "kubelet":
		end(n.kubelet)
		n.startKubelet(t)
	case "containerd":
		end(n.containerd)
		n.startContainerd(t)
	}
}

func (n *node) stop(t *testing.T) {
	// A pod the test left would outlive containerd (its shim does) and
	// run on beside the next tests: the kubelet gets some time to end the
	// pods still stopping; what runs after that is the test's fault, and
	// is killed.
	var left []string
	nettest.Eventually(20*time.Second, func() bool { left = n.tasks(); return len(left) == 0 })
	// The kubelet first, so it does not restart what containerd ends;
	// then the control plane, newest first.
	end(n.kubelet)
	for i := len(n.control) - 1; i >= 0; i-- {
		end(n.control[i])
	}
	if len(left) > 0 {
		if !t.Failed() {
			t.Errorf("the node ends with pods' tasks still running (the test did not remove their pods): %v", left)
		}
		for _, id := range left {
			_ = n.ctr("tasks", "kill", "--signal", "SIGKILL", id)
		}
	}
	end(n.containerd)
	if n.peer != nil {
		end(n.peer)
	}
	// The daemons' logs are kept in a directory of their own on failure
	// (keepLogs), not printed: pages of them would bury the failure's own
	// message, and a CI run shows only the end of the output.
}

func end(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func httpOK(url string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == 200
}

// setNetwork writes the node's conflist (bridge, host-local, portmap with
// the given keys) and restarts containerd, so that the next sandbox is
// sure to use it (containerd reloads a changed conflist only some time
// after the change).
func (n *node) setNetwork(t *testing.T, portmap map[string]any) {
	t.Helper()
	pm := map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}}
	for k, v := range portmap {
		pm[k] = v
	}
	list := map[string]any{
		"cniVersion": n.rt.cniVersion,
		"name":       "kube",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "kube0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": podV4}}, {{"subnet": podV6}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
				},
			},
			pm,
		},
	}
	n.writeConflist(t, list)
}

// writeConflist writes the node's conflist and restarts containerd (see
// setNetwork).
func (n *node) writeConflist(t *testing.T, list map[string]any) {
	t.Helper()
	data, _ := json.MarshalIndent(list, "", "  ")
	path := filepath.Join(n.at(n.cniConf), "10-kube.conflist")
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	if n.containerd != nil {
		n.restart(t, "containerd")
	}
}

// The pods' subnets (documentation ranges, in the node's namespace only).
const (
	podV4 = "203.0.113.0/24"
	podV6 = "2001:db8:113::/64"
)

// pod is a static pod of the suite.
type pod struct {
	Name  string
	Ports []port
}

type port struct {
	ContainerPort int    `json:"containerPort"`
	HostPort      int    `json:"hostPort,omitempty"`
	Protocol      string `json:"protocol,omitempty"`
	HostIP        string `json:"hostIP,omitempty"`
}

// run writes the pod's manifest (written aside, then renamed in, so the
// kubelet never reads half of it); its server answers as the pod's name.
func (n *node) run(t *testing.T, p pod) {
	t.Helper()
	m := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": p.Name, "namespace": "default"},
		"spec": map[string]any{
			"terminationGracePeriodSeconds": 1,
			"containers": []any{map[string]any{
				"name":            "server",
				"image":           serverImage,
				"imagePullPolicy": "Never",
				"args":            []string{"serve", p.Name, "8080"},
				"ports":           p.Ports,
			}},
		},
	}
	data, _ := json.Marshal(m)
	tmp := filepath.Join(n.dir, p.Name+".json")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(n.manifests, p.Name+".json")); err != nil {
		t.Fatal(err)
	}
}

// remove deletes the pod's manifest: the kubelet stops the pod.
func (n *node) remove(t *testing.T, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(n.manifests, name+".json")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// cached lists libcni's cache entries of the node's network
// (containerd's go-cni keeps them in /var/lib/cni, the node's own, beside
// those of its loopback network).
func cached() []string { return (&node{}).cached() }

// cached lists the node's libcni cache entries of its network.
func (n *node) cached() []string {
	ents, _ := os.ReadDir(n.at("/var/lib/cni/results"))
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "kube-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// leases lists host-local's leases of the node's network.
func leases() []string {
	ents, _ := os.ReadDir("/var/lib/cni/networks/kube")
	var names []string
	for _, e := range ents {
		if e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip") {
			names = append(names, e.Name())
		}
	}
	return names
}

// portmapList is `portmap-agent list --json` on the node: every mapping of
// every backend.
func portmapList(t *testing.T) []map[string]any {
	t.Helper()
	out, stderr, status, err := nettest.Agent("list", "--json")
	if err != nil || status != 0 {
		t.Fatalf("portmap-agent list: exit %d %v\n%s", status, err, stderr)
	}
	var entries []map[string]any
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("portmap-agent list --json: %v\n%s", err, out)
	}
	return entries
}

// daemonSetImage is the image deploy/portmap.yaml runs, as `make image`
// builds it (Containerfile: the static plugin and agent, FROM scratch,
// the host's PATH for the agent's chroot), imported under its name.
func (n *node) importDaemonSetImage(t *testing.T, name string) (plugin string) {
	t.Helper()
	out := filepath.Join(n.dir, "image")
	build := exec.Command("go", "build", "-o", out+"/", "github.com/portmap-dev/portmap/cmd/portmap", "github.com/portmap-dev/portmap/cmd/portmap-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the image's binaries: %v\n%s", err, b)
	}
	archive := filepath.Join(n.dir, "portmap-image.tar")
	files := map[string]string{"/portmap": filepath.Join(out, "portmap"), "/portmap-agent": filepath.Join(out, "portmap-agent")}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if err := ociArchive(archive, name, files, []string{"/portmap-agent"}, env); err != nil {
		t.Fatal(err)
	}
	if err := n.ctr("images", "import", archive); err != nil {
		t.Fatal(err)
	}
	return files["/portmap"]
}

// runManifest writes a pod manifest of any shape (as the kubelet reads
// it: JSON is YAML) into the static pod directory.
func (n *node) runManifest(t *testing.T, name string, manifest any) {
	t.Helper()
	data, err := json.Marshal(manifest)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(n.dir, name+".json")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(n.manifests, name+".json")); err != nil {
		t.Fatal(err)
	}
}

// podStatus is what the kubelet's /pods says of a pod: its phase, whether
// it is Ready, and its containers' restarts.
type podStatus struct {
	Phase    string
	Ready    bool
	Restarts int
	Found    bool
}

// status asks the kubelet's API (/pods on its port 10250: anonymous,
// AlwaysAllow, on 127.0.0.1 of the node) about the pod named name; with
// annotation (a key and a value), about the one that carries it.
func (n *node) status(name string, annotation ...string) podStatus {
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get("https://127.0.0.1:10250/pods")
	if err != nil {
		return podStatus{}
	}
	defer resp.Body.Close()
	var list struct {
		Items []struct {
			Metadata struct {
				Name        string
				Annotations map[string]string
			}
			Status struct {
				Phase      string
				Conditions []struct{ Type, Status string }
				// the API's field names
				ContainerStatuses []struct {
					RestartCount int `json:"restartCount"`
				} `json:"containerStatuses"`
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return podStatus{}
	}
	for _, p := range list.Items {
		if p.Metadata.Name != name || (len(annotation) == 2 && p.Metadata.Annotations[annotation[0]] != annotation[1]) {
			continue
		}
		s := podStatus{Phase: p.Status.Phase, Found: true}
		for _, c := range p.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				s.Ready = true
			}
		}
		for _, c := range p.Status.ContainerStatuses {
			s.Restarts += c.RestartCount
		}
		return s
	}
	return podStatus{}
}

// at is path of the node's file system as this process reaches it: a
// second node's own directories (its tmpfs on /run, /var/lib, /opt, …)
// through its holder's root.
func (n *node) at(path string) string {
	if n.peer == nil {
		return path
	}
	return fmt.Sprintf("/proc/%d/root%s", n.peer.Process.Pid, path)
}

// command is a command of the node: for a second node, run by nsenter in
// its network and mount namespaces (the PID namespace is the suite's,
// so it ends with the suite).
func (n *node) command(path string, args ...string) *exec.Cmd {
	if n.peer == nil {
		return exec.Command(path, args...)
	}
	pre := []string{"--target", fmt.Sprint(n.peer.Process.Pid), "--net", "--mount", "--"}
	return exec.Command("nsenter", append(append(pre, path), args...)...)
}
