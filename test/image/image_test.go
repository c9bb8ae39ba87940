// Package image tests the node packaging: the image `make image` builds
// (FROM scratch, the static binary) installs the plugin into a CNI bin
// directory, and its watcher's `--root` runs the host's own tools. podman
// needs the node's cgroup mounts, so this binary stays in the node's
// mount namespace; every container runs with no network or in a network
// namespace the test makes.
package image

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"

	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/test/deploy"
	"github.com/portmap-dev/portmap/test/nettest"
)

func TestMain(m *testing.M) { nettest.MainInPlace(m, "the image tests", "podman") }

// netns makes a named network namespace for one container, removed when
// the test ends.
func netns(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("pmimg-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

const image = "localhost/portmap:test"

// podman runs podman with the flags this workplace's hosts need to start
// a container (cgroup v1 hybrid: the cgroupfs manager with runc; no
// CAP_SYS_RESOURCE: limits no higher than the current ones); they work on
// any host.
func podman(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var pre []string
	if args[0] == "run" {
		if _, err := exec.LookPath("runc"); err == nil {
			pre = []string{"--cgroup-manager", "cgroupfs", "--runtime", "runc"}
		}
		args = append([]string{"run", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}, args[1:]...)
	}
	out, err := exec.Command("podman", append(pre, args...)...).CombinedOutput()
	return string(out), err
}

func buildImage(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("podman is not installed; CI must install it (test/deps.sh)")
		}
		t.Skip("podman is not installed: skipping the image tests")
	}
	ctx := t.TempDir()
	build := exec.Command("go", "build", "-o", ctx+"/", "github.com/portmap-dev/portmap/cmd/portmap", "github.com/portmap-dev/portmap/cmd/portmap-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if out, err := podman(t, "build", "-f", "../../Containerfile", "-t", image, ctx); err != nil {
		t.Fatalf("podman build: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = podman(t, "rmi", "-f", image) })
}

// TestImageInstalls: the init container's job puts a working plugin into
// the bin directory, atomically (no temporary file left).
func TestImageInstalls(t *testing.T) {
	buildImage(t)
	dest := t.TempDir()
	if err := os.WriteFile(filepath.Join(dest, "portmap"), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := podman(t, "run", "--rm", "--network", "none", "-v", dest+":/host/opt/cni/bin", "--entrypoint", "/portmap", image,
		"install", "--dest", "/host/opt/cni/bin")
	if err != nil || !strings.Contains(out, "installed /host/opt/cni/bin/portmap") {
		t.Fatalf("podman run install: %v\n%s", err, out)
	}
	entries, _ := os.ReadDir(dest)
	if len(entries) != 1 {
		t.Errorf("bin directory holds %v, want portmap alone", entries)
	}
	fi, err := os.Stat(filepath.Join(dest, "portmap"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("installed file: %v %v", fi, err)
	}
	cmd := exec.Command(filepath.Join(dest, "portmap"))
	cmd.Env = nettest.PluginEnv("VERSION", "", "", dest)
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
	got, err := cmd.Output()
	if err != nil || !strings.Contains(string(got), `"supportedVersions"`) || !strings.Contains(string(got), "1.1.0") {
		t.Errorf("the installed plugin's VERSION: %q, %v", got, err)
	}
}

// TestImageSyncUsesHostTools: `sync --root /host` in the image (which has
// no iptables of its own) lists the host's firewall with the host's tools
// and reads a cache on the host.
func TestImageSyncUsesHostTools(t *testing.T) {
	buildImage(t)
	cache := t.TempDir()
	err := cnicache.Write(cache, cnicache.Entry{Network: "img", ContainerID: "c1", IfName: "eth0",
		Conflist:       []byte(`{"cniVersion":"1.0.0","name":"img","plugins":[{"type":"ptp"},{"type":"portmap","capabilities":{"portMappings":true}}]}`),
		CapabilityArgs: map[string]any{"portMappings": []any{map[string]any{"hostPort": 8080, "containerPort": 80}}},
		Result: map[string]any{"cniVersion": "1.0.0", "interfaces": []any{map[string]any{"name": "eth0", "sandbox": "/x"}},
			"ips": []any{map[string]any{"address": "192.0.2.2/24", "interface": 0}}}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := podman(t, "run", "--rm", "--network", "ns:"+netns(t), "--cap-add", "NET_ADMIN,NET_RAW,SYS_CHROOT",
		"-v", "/:/host", image, "sync", "--root", "/host", "--dry-run", "--cache-dir", cache)
	if err != nil {
		t.Fatalf("podman run sync: %v\n%s", err, out)
	}
	if !strings.Contains(out, "img c1 eth0: would repair: ipv4: missing chain CNI-DN-") || !strings.Contains(out, "sync: 1 attachments") {
		t.Errorf("sync in the image:\n%s", out)
	}
}

// TestImageRunsTheDaemonSetPod: the agent container of deploy/portmap.yaml
// run with podman as the pod spec says — its command and arguments, its
// capabilities, its mounts (the host's / at /host, the libcni cache
// read-only over it; here a cache of the test's) — in a network namespace
// of the test's instead of the host's: the probes the pod spec names
// answer 200 once the first pass ended, and /metrics counts passes.
func TestImageRunsTheDaemonSetPod(t *testing.T) {
	buildImage(t)
	ds, err := deploy.Read()
	if err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	nsPath := netns(t)
	if out, err := exec.Command("ip", "netns", "exec", filepath.Base(nsPath), "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v\n%s", err, out)
	}
	cache := t.TempDir()
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	name := fmt.Sprintf("pmimg-agent-%d", os.Getpid())
	args := []string{"run", "-d", "--name", name, "--network", "ns:" + nsPath}
	for _, cp := range c.SecurityContext.Capabilities.Add {
		args = append(args, "--cap-add", string(cp))
	}
	for _, m := range c.VolumeMounts {
		src := hostPaths[m.Name]
		if src == "" {
			t.Fatalf("mount %s: no hostPath volume %q", m.MountPath, m.Name)
		}
		if src == "/var/lib/cni" {
			src = cache // never the machine's own cache
		}
		var opts []string
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		if m.MountPropagation != nil && *m.MountPropagation == "HostToContainer" {
			opts = append(opts, "rslave")
		}
		v := src + ":" + m.MountPath
		if len(opts) > 0 {
			v += ":" + strings.Join(opts, ",")
		}
		args = append(args, "-v", v)
	}
	args = append(args, "--entrypoint", c.Command[0], image)
	args = append(args, c.Args...)
	if out, err := podman(t, args...); err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := podman(t, "logs", name)
			t.Logf("the agent's log:\n%s", out)
		}
		_, _ = podman(t, "rm", "-f", "-t", "2", name)
	})
	n, err := ns.GetNS(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for _, p := range []struct {
		name string
		get  *corev1.HTTPGetAction
	}{{"liveness", c.LivenessProbe.HTTPGet}, {"readiness", c.ReadinessProbe.HTTPGet}} {
		addr := net.JoinHostPort(p.get.Host, p.get.Port.String())
		var code int
		var body string
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if code, body, err = httpGet(n, addr, p.get.Path); err == nil && code == 200 {
				break
			}
		}
		if code != 200 {
			t.Errorf("%s probe GET %s%s: %d %q %v, want 200", p.name, addr, p.get.Path, code, body, err)
		}
	}
	live := c.LivenessProbe.HTTPGet
	_, metrics, err := httpGet(n, net.JoinHostPort(live.Host, live.Port.String()), "/metrics")
	if err != nil || !strings.Contains(metrics, `portmap_agent_passes_total{trigger="start"} 1`) {
		t.Errorf("/metrics: %v\n%s", err, metrics)
	}
}

// httpGet sends GET path to addr from inside network namespace n (a
// plain HTTP/1.0 exchange on a connection dialled on the locked thread:
// net/http would dial from another goroutine, in another namespace) and
// returns the status code and body.
func httpGet(n ns.NetNS, addr, path string) (code int, body string, err error) {
	err = n.Do(func(ns.NetNS) error {
		conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		code, body = resp.StatusCode, string(b)
		return err
	})
	return code, body, err
}
