//go:build kube

package kube

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/test/deploy"
	"github.com/portmap-dev/portmap/test/nettest"
)

// TestCluster: a control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler) and a kubelet that registers
// the node. For each backend, and a node whose localhost is served by
// the socket path (with its test site): Helm's install action installs the chart
// deploy/chart (the DaemonSet rolls out, its init container installs the
// plugin containerd then uses); a Deployment's pod with a host port is
// scheduled and reachable from the node's LAN; Helm's upgrade action
// changes a value of the agent (the controller replaces the pod, a
// rolling update) and the running pod's host port answers throughout,
// and the new agent repairs a flush; deleting the Deployment removes its
// mappings and cache entry; Helm's uninstall removes the DaemonSet.
func TestCluster(t *testing.T) {
	ds, err := deploy.Read()
	if err != nil {
		t.Fatal(err)
	}
	cl := nettest.NewClient(t, clientNet)
	node4 := cl.HostIP[0].String()
	at := func(port int) string { return net.JoinHostPort(node4, fmt.Sprint(port)) }
	hostPort := func(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
	start := time.Now()
	n, c := startClusterNode(t, containerd16, node4)
	n.setNetwork(t, map[string]any{"backend": "iptables"})
	c.waitReady(t, n)
	t.Logf("control plane up and node1 Ready %s after the start", time.Since(start).Round(100*time.Millisecond))

	plugin := n.importDaemonSetImage(t, ds.Spec.Template.Spec.InitContainers[0].Image)
	want, err := os.ReadFile(plugin)
	if err != nil {
		t.Fatal(err)
	}
	installed := filepath.Join(n.cniBin, "portmap")
	for _, v := range networks {
		b := v.backend
		t.Run(v.name, func(t *testing.T) {
			keys := map[string]any{"backend": b}
			var site *nettest.CgroupSite
			if v.socket {
				// before the chart: the agent's pod sees the site's
				// mounts through the node's / as they were at its start
				site = nettest.NewCgroupSite(t)
				keys["localhost"], keys["cgroupPath"], keys["bpfPinDir"] = "socket", site.Cgroup, site.PinDir
			}
			n.setNetwork(t, keys)
			localhost := func() error {
				if !v.socket {
					return nil
				}
				res, err := site.Client("tcp", hostPort("127.0.0.1", 18200), false)
				if err == nil && !strings.HasPrefix(res.Reply, "web sees ") {
					err = fmt.Errorf("127.0.0.1:18200 from the node's cgroup answered %q", res.Reply)
				}
				return err
			}
			if err := os.Remove(installed); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			h := c.helm(t, "portmap", ds.Namespace)
			start := time.Now()
			if err := h.install(nil); err != nil {
				t.Fatalf("helm install: %v", err)
			}
			rollout := func(what string) {
				t.Helper()
				if out, err := c.kubectl("-n", ds.Namespace, "rollout", "status", "daemonset/"+ds.Name, "--timeout=120s"); err != nil {
					t.Fatalf("%s: %v\n%s\n%s", what, err, out, n.log("kubelet"))
				}
			}
			rollout("the DaemonSet's rollout")
			t.Logf("%s: the chart installed and its DaemonSet rolled out in %s", v.name, time.Since(start).Round(100*time.Millisecond))
			if got, err := os.ReadFile(installed); err != nil || string(got) != string(want) {
				t.Fatalf("%s after the DaemonSet's init container: %d bytes %v, want the image's plugin (%d bytes)", installed, len(got), err, len(want))
			}
			agentPod := func() string {
				out, _ := c.kubectl("-n", ds.Namespace, "get", "pods", "-l", "app.kubernetes.io/name="+ds.Name,
					"--field-selector", "status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}")
				return out
			}
			first := agentPod()

			// A Deployment's pod with a host port, scheduled onto node1.
			start = time.Now()
			c.apply(t, n, "web", webDeployment(port{ContainerPort: 8080, HostPort: 18200, Protocol: "TCP"}, port{ContainerPort: 8080, HostPort: 18200, Protocol: "UDP"}))
			who := "web sees " + cl.IP[0].String()
			reply(t, cl, "tcp", at(18200), who, 90*time.Second)
			t.Logf("%s: the Deployment's pod answered on its host port %s after kubectl apply", v.name, time.Since(start).Round(100*time.Millisecond))
			reply(t, cl, "udp", at(18200), who, 10*time.Second)
			if node := c.mustKubectl(t, "get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].spec.nodeName}"); node != "node1" {
				t.Errorf("the Deployment's pod is on %q, want node1 (the scheduler's choice)", node)
			}
			if err := localhost(); err != nil {
				t.Errorf("the socket path: %v", err)
			}

			// An upgrade that changes a value of the agent: the
			// controller replaces its pod.
			start = time.Now()
			failed := 0
			asked, rolled := c.rollDaemonSet(ds.Namespace, ds.Name, func() error {
				return h.upgrade(map[string]any{"agent": map[string]any{"minSyncPeriod": "2s"}})
			}, func() {
				if _, err := nettest.Dial(cl.NS, "tcp", at(18200)); err != nil {
					failed++
				} else if err := localhost(); err != nil {
					failed++
				}
			})
			if rolled != nil {
				t.Fatalf("helm upgrade's rolling update: %v\n%s", rolled, n.log("kubelet"))
			}
			second := agentPod()
			if second == "" || second == first {
				t.Errorf("the DaemonSet's pod after the upgrade is %q, before it %q: want a new one", second, first)
			}
			if args := c.mustKubectl(t, "-n", ds.Namespace, "get", "daemonset", ds.Name, "-o", "jsonpath={.spec.template.spec.containers[0].args}"); !strings.Contains(args, `"--min-sync-period","2s"`) {
				t.Errorf("the DaemonSet's args after the upgrade: %s, want the new value", args)
			}
			if failed > 0 {
				t.Errorf("the running pod's host port failed %d of %d times during the upgrade's rolling update", failed, asked)
			}
			t.Logf("%s: helm upgrade's rolling update (%s → %s) took %s; the Deployment's host port answered %d of %d times",
				v.name, first, second, time.Since(start).Round(100*time.Millisecond), asked-failed, asked)

			// The new agent repairs a firewall flush.
			for _, f := range flushes[b] {
				if out, err := exec.Command(f[0], f[1:]...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v\n%s", f, err, out)
				}
			}
			start = time.Now()
			reply(t, cl, "tcp", at(18200), who, 15*time.Second)
			t.Logf("%s: the host port answered again %s after the flush (the upgraded agent's repair)", v.name, time.Since(start).Round(100*time.Millisecond))
			if err := localhost(); err != nil {
				t.Errorf("the socket path after the flush: %v", err)
			}

			c.mustKubectl(t, "delete", "deployment", "web", "--wait=true", "--timeout=60s")
			if !nettest.Eventually(60*time.Second, func() bool { return len(portmapList(t)) == 0 && len(cached()) == 0 }) {
				t.Errorf("60 s after the Deployment's deletion: mappings %v, cache %v", portmapList(t), cached())
			}
			refused(t, cl, "tcp", at(18200))
			var left string
			if !nettest.Eventually(60*time.Second, func() bool {
				left, err = c.kubectl("get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.name}")
				return err == nil && left == ""
			}) {
				t.Errorf("the Deployment's pods left 60 s after its deletion: %q %v", left, err)
			}

			// The release goes too: its agent would outlive the node (a
			// pod's shim outlives containerd) and repair the next tests'
			// flushes.
			if err := h.uninstall(); err != nil {
				t.Fatalf("helm uninstall: %v", err)
			}
			if !nettest.Eventually(60*time.Second, func() bool { return agentPod() == "" && !httpOK("http://127.0.0.1:9765/healthz") }) {
				t.Errorf("the DaemonSet's pod still runs 60 s after helm uninstall: %q", agentPod())
			}
		})
	}
}

// rollDaemonSet starts a rolling update of DaemonSet namespace/name with
// roll (an upgrade that changes its pod template) and, until the rollout
// is done, calls try every 100 ms; it returns how many times, and the
// rollout's error.
func (c *controlPlane) rollDaemonSet(namespace, name string, roll func() error, try func()) (int, error) {
	if err := roll(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.kubectl("-n", namespace, "rollout", "status", "daemonset/"+name, "--timeout=120s")
		done <- err
	}()
	for tries := 0; ; tries++ {
		select {
		case err := <-done:
			return tries, err
		case <-time.After(100 * time.Millisecond):
			try()
		}
	}
}
