//go:build kube

package kube

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/test/deploy"
	"github.com/portmap-dev/portmap/test/nettest"
)

// TestCluster: a control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler) and a kubelet that registers
// the node. `kubectl apply -f deploy/portmap.yaml` rolls the DaemonSet
// out (its init container installs the plugin containerd then uses); a
// Deployment's pod with a host port is scheduled and reachable from the
// node's LAN; a rolling update of the DaemonSet (kubectl rollout restart:
// the controller replaces the pod) leaves the running pod's host port
// answering throughout, and the new agent repairs a flush; deleting the
// Deployment removes its mappings and cache entry.
func TestCluster(t *testing.T) {
	ds, err := deploy.Read()
	if err != nil {
		t.Fatal(err)
	}
	cl := nettest.NewClient(t, clientNet)
	node4 := cl.HostIP[0].String()
	at := func(port int) string { return net.JoinHostPort(node4, fmt.Sprint(port)) }
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
	if err := os.Remove(installed); err != nil {
		t.Fatal(err)
	}
	manifest, err := filepath.Abs("../../deploy/portmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	c.mustKubectl(t, "apply", "-f", manifest)
	rollout := func(what string) {
		t.Helper()
		if out, err := c.kubectl("-n", ds.Namespace, "rollout", "status", "daemonset/"+ds.Name, "--timeout=120s"); err != nil {
			t.Fatalf("%s: %v\n%s\n%s", what, err, out, n.log("kubelet"))
		}
	}
	rollout("the DaemonSet's rollout")
	t.Logf("the DaemonSet rolled out in %s", time.Since(start).Round(100*time.Millisecond))
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
	t.Logf("the Deployment's pod answered on its host port %s after kubectl apply", time.Since(start).Round(100*time.Millisecond))
	reply(t, cl, "udp", at(18200), who, 10*time.Second)
	if node := c.mustKubectl(t, "get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].spec.nodeName}"); node != "node1" {
		t.Errorf("the Deployment's pod is on %q, want node1 (the scheduler's choice)", node)
	}

	// A rolling update of the DaemonSet: the controller replaces its pod.
	start = time.Now()
	failed := 0
	asked, rolled := c.restartDaemonSet(ds.Namespace, ds.Name, func() {
		if _, err := nettest.Dial(cl.NS, "tcp", at(18200)); err != nil {
			failed++
		}
	})
	if rolled != nil {
		t.Fatalf("the DaemonSet's rolling update: %v\n%s", rolled, n.log("kubelet"))
	}
	second := agentPod()
	if second == "" || second == first {
		t.Errorf("the DaemonSet's pod after the rolling update is %q, before it %q: want a new one", second, first)
	}
	if failed > 0 {
		t.Errorf("the running pod's host port failed %d of %d times during the DaemonSet's rolling update", failed, asked)
	}
	t.Logf("the DaemonSet's rolling update (%s → %s) took %s; the Deployment's host port answered %d of %d times",
		first, second, time.Since(start).Round(100*time.Millisecond), asked-failed, asked)

	// The new agent repairs a firewall flush.
	for _, f := range flushes["iptables"] {
		if out, err := exec.Command(f[0], f[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", f, err, out)
		}
	}
	start = time.Now()
	reply(t, cl, "tcp", at(18200), who, 15*time.Second)
	t.Logf("the host port answered again %s after the flush (the updated agent's repair)", time.Since(start).Round(100*time.Millisecond))

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

	// The DaemonSet goes too: its agent would outlive the node (a pod's
	// shim outlives containerd) and repair the next tests' flushes.
	c.mustKubectl(t, "-n", ds.Namespace, "delete", "daemonset", ds.Name, "--wait=true", "--timeout=60s")
	if !nettest.Eventually(60*time.Second, func() bool { return agentPod() == "" && !httpOK("http://127.0.0.1:9765/healthz") }) {
		t.Errorf("the DaemonSet's pod still runs 60 s after its deletion: %q", agentPod())
	}
}

// restartDaemonSet restarts DaemonSet namespace/name (kubectl rollout
// restart: the controller replaces its pods, one node at a time) and,
// until the rollout is done, calls try every 100 ms; it returns how many
// times, and the rollout's error.
func (c *controlPlane) restartDaemonSet(namespace, name string, try func()) (int, error) {
	if _, err := c.kubectl("-n", namespace, "rollout", "restart", "daemonset/"+name); err != nil {
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
