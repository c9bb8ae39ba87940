//go:build kube

package kube

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/portmap-dev/portmap/test/deploy"
	"github.com/portmap-dev/portmap/test/nettest"
)

// TestTwoNodes: the cluster people run, twice (kube-proxy in its
// iptables mode, then in its nftables mode). Two nodes, each its own
// network and mount namespaces with containerd and a kubelet, on one LAN
// (a bridge in a namespace of the suite's own) beside a LAN client;
// flanneld on each (Kubernetes subnet manager, VXLAN) and the conflist
// flannel's CNI plugin would delegate to, with portmap chained after it;
// kube-proxy on each. With each of our backends a Deployment's pod with
// a host port runs on node2, behind a NodePort Service, and answers at
// node2's address: from the LAN client (which it sees as itself), from a
// pod on node1, from node2 (its address and 127.0.0.1) and from itself
// (hairpin); the Service answers at its ClusterIP from node1 and at its
// NodePort on either node from the LAN (through flannel's VXLAN from
// node1). Deleting the Deployment leaves node2 without a mapping or a
// cache entry.
func TestTwoNodes(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run("kube-proxy-"+mode, func(t *testing.T) { twoNodes(t, mode) })
	}
}

func twoNodes(t *testing.T, mode string) {
	start := time.Now()
	l := newLAN(t)
	ip1, ip2 := lanPrefix+".1", lanPrefix+".3"
	l.plug(t, "kl1", nil)
	if err := nettest.Configure("kl1", []string{ip1 + "/24"}, nil); err != nil {
		t.Fatal(err)
	}
	n1, c := startClusterNode(t, containerd16, ip1)
	n1.link = "kl1"
	n2 := startPeerNode(t, c, l, containerd16, "node2", ip2)
	nodes := []*node{n1, n2}
	ips := map[*node]string{n1: ip1, n2: ip2}
	envs := map[*node]map[string]string{}
	for _, n := range nodes {
		c.waitPodCIDR(t, n)
		n.startFlannel(t)
	}
	for _, n := range nodes {
		envs[n] = n.subnetEnv(t)
		n.setFlannelNetwork(t, envs[n], map[string]any{"backend": "iptables"})
	}
	for _, n := range nodes {
		c.waitReady(t, n)
		// the Services' range is routed as a node's default route would:
		// the node reaches a ClusterIP through kube-proxy's DNAT
		if out, err := n.command("ip", "route", "add", serviceRange, "dev", n.link).CombinedOutput(); err != nil {
			t.Fatalf("%s: ip route add %s: %v %s", n.name, serviceRange, err, out)
		}
		n.startKubeProxy(t, mode, ips[n], clusterCIDR)
	}
	t.Logf("two nodes Ready with flannel (%s, %s) %s after the start", envs[n1]["FLANNEL_SUBNET"], envs[n2]["FLANNEL_SUBNET"],
		time.Since(start).Round(100*time.Millisecond))

	c.apply(t, n1, "service", webService())
	clusterIP := c.mustKubectl(t, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")
	at := func(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
	from2 := &nettest.Client{NS: n2.netNS}
	who := "web sees "

	for _, backend := range backends {
		for _, n := range nodes {
			n.setFlannelNetwork(t, envs[n], map[string]any{"backend": backend})
		}
		// web on node2, behind the Service; probe on node1, the other
		// end of the cross-node connections
		start := time.Now()
		c.apply(t, n1, "web", pinned(webDeployment(webPort), "web", "node2"))
		c.apply(t, n1, "probe", pinned(webDeployment(probePort), "probe", "node1"))
		for _, p := range []struct {
			node, ip, who string
			port          int
		}{{"node2", ip2, who, webHostPort}, {"node1", ip1, "probe sees ", probeHostPort}} {
			reply(t, l.client, "tcp", at(p.ip, p.port), p.who+l.client.IP[0].String(), 90*time.Second)
			t.Logf("kube-proxy %s mode, %s backend: the pod on %s answered on its host port %s after kubectl apply",
				mode, backend, p.node, time.Since(start).Round(100*time.Millisecond))
		}
		reply(t, n1.podClient(t, c, "probe"), "tcp", at(ip2, webHostPort), who, 10*time.Second)
		reply(t, n2.podClient(t, c, "web"), "tcp", at(ip1, probeHostPort), "probe sees ", 10*time.Second)
		reply(t, from2, "tcp", at(ip2, webHostPort), who, 5*time.Second)
		reply(t, from2, "tcp", at("127.0.0.1", webHostPort), who, 5*time.Second)
		reply(t, n2.podClient(t, c, "web"), "tcp", at(ip2, webHostPort), who, 5*time.Second)
		reply(t, nil, "tcp", at(clusterIP, servicePort), who, 30*time.Second)
		reply(t, l.client, "tcp", at(ip1, nodePort), who, 30*time.Second)
		reply(t, l.client, "tcp", at(ip2, nodePort), who, 30*time.Second)
		for _, name := range []string{"web", "probe"} {
			c.mustKubectl(t, "delete", "deployment", name, "--wait=true", "--timeout=60s")
		}
		c.waitGone(t, nodes...)
		refused(t, l.client, "tcp", at(ip2, webHostPort))
		refused(t, l.client, "tcp", at(ip1, probeHostPort))
	}
	if mode == "iptables" { // once: kube-proxy's mode is not its business
		daemonSetOnTwoNodes(t, c, l, n1, n2)
	}
}

// daemonSetOnTwoNodes: `kubectl apply -f deploy/portmap.yaml` rolls the
// DaemonSet out on both nodes; with a hostPort pod on each, its rolling
// update (one node at a time) leaves both host ports answering
// throughout; `kubectl drain node2` deletes node2's hostPort pod through
// DEL and leaves node2 without a mapping or a cache entry while node1's
// answers on; after `kubectl uncordon node2` the Deployment's new pod
// there answers on its host port.
func daemonSetOnTwoNodes(t *testing.T, c *controlPlane, l *lan, n1, n2 *node) {
	ds, err := deploy.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*node{n1, n2} {
		n.importDaemonSetImage(t, ds.Spec.Template.Spec.InitContainers[0].Image)
	}
	manifest, err := filepath.Abs("../../deploy/portmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rollout := func(what string) {
		t.Helper()
		if out, err := c.kubectl("-n", ds.Namespace, "rollout", "status", "daemonset/"+ds.Name, "--timeout=120s"); err != nil {
			t.Fatalf("%s: %v\n%s\n%s", what, err, out, n2.log("kubelet"))
		}
	}
	agents := func() string {
		out, _ := c.kubectl("-n", ds.Namespace, "get", "pods", "-l", "app.kubernetes.io/name="+ds.Name,
			"-o", "jsonpath={range .items[*]}{.spec.nodeName}={.metadata.name} {end}")
		return strings.TrimSpace(out)
	}
	start := time.Now()
	c.mustKubectl(t, "apply", "-f", manifest)
	rollout("the DaemonSet's rollout")
	first := agents()
	if !strings.Contains(first, "node1=") || !strings.Contains(first, "node2=") {
		t.Fatalf("the DaemonSet's pods: %q, want one on node1 and one on node2", first)
	}
	t.Logf("the DaemonSet rolled out on both nodes in %s", time.Since(start).Round(100*time.Millisecond))

	at := func(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
	web, probe := at(lanPrefix+".3", webHostPort), at(lanPrefix+".1", probeHostPort)
	c.apply(t, n1, "web", pinned(webDeployment(webPort), "web", "node2"))
	c.apply(t, n1, "probe", pinned(webDeployment(probePort), "probe", "node1"))
	reply(t, l.client, "tcp", web, "web sees ", 90*time.Second)
	reply(t, l.client, "tcp", probe, "probe sees ", 90*time.Second)

	// the rolling update: one node's agent at a time
	start = time.Now()
	failed := map[string]int{}
	restart := func() error {
		_, err := c.kubectl("-n", ds.Namespace, "rollout", "restart", "daemonset/"+ds.Name)
		return err
	}
	asked, rolled := c.rollDaemonSet(ds.Namespace, ds.Name, restart, func() {
		for _, addr := range []string{web, probe} {
			if _, err := nettest.Dial(l.client.NS, "tcp", addr); err != nil {
				failed[addr]++
			}
		}
	})
	if rolled != nil {
		t.Fatalf("the DaemonSet's rolling update: %v", rolled)
	}
	if second := agents(); second == first {
		t.Errorf("the DaemonSet's pods after the rolling update are the ones before it: %q", second)
	}
	for addr, n := range failed {
		t.Errorf("%s failed %d of %d times during the DaemonSet's rolling update", addr, n, asked)
	}
	t.Logf("the DaemonSet's rolling update took %s; both host ports answered %d times each, failed %v",
		time.Since(start).Round(100*time.Millisecond), asked, failed)

	// drain: node2's hostPort pod is evicted, its DEL leaves nothing
	start = time.Now()
	c.mustKubectl(t, "drain", "node2", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s")
	var held string
	if !nettest.Eventually(30*time.Second, func() bool {
		held = n2.mappings(t)
		return (held == "[]" || held == "null") && len(n2.cached()) == 0
	}) {
		t.Errorf("node2 30 s after kubectl drain: mappings %s, cache %v", held, n2.cached())
	}
	refused(t, l.client, "tcp", web)
	reply(t, l.client, "tcp", probe, "probe sees ", 5*time.Second)
	t.Logf("kubectl drain node2: its host port gone %s after the drain began", time.Since(start).Round(100*time.Millisecond))

	start = time.Now()
	c.mustKubectl(t, "uncordon", "node2")
	reply(t, l.client, "tcp", web, "web sees "+l.client.IP[0].String(), 90*time.Second)
	t.Logf("kubectl uncordon node2: the Deployment's new pod there answered on its host port %s after", time.Since(start).Round(100*time.Millisecond))

	for _, name := range []string{"web", "probe"} {
		c.mustKubectl(t, "delete", "deployment", name, "--wait=true", "--timeout=60s")
	}
	c.waitGone(t, n1, n2)
	// the DaemonSet goes too: its agents would outlive the nodes (a pod's
	// shim outlives containerd)
	c.mustKubectl(t, "-n", ds.Namespace, "delete", "daemonset", ds.Name, "--wait=true", "--timeout=60s")
	if !nettest.Eventually(60*time.Second, func() bool { return agents() == "" }) {
		t.Errorf("the DaemonSet's pods still run 60 s after its deletion: %q", agents())
	}
}

// probe's host port, on node1.
const probeHostPort = 18301

var probePort = port{ContainerPort: 8080, HostPort: probeHostPort, Protocol: "TCP"}

// waitGone waits up to 60 s for the default namespace to have no pod and
// the nodes no mapping and no cache entry.
func (c *controlPlane) waitGone(t *testing.T, nodes ...*node) {
	t.Helper()
	var left string
	var held []string
	if !nettest.Eventually(60*time.Second, func() bool {
		left, _ = c.kubectl("get", "pods", "-o", "jsonpath={.items[*].metadata.name}")
		held = nil
		for _, n := range nodes {
			if m := n.mappings(t); (m != "[]" && m != "null") || len(n.cached()) > 0 {
				held = append(held, fmt.Sprintf("%s: mappings %s, cache %v", n.name, m, n.cached()))
			}
		}
		return left == "" && len(held) == 0
	}) {
		t.Fatalf("60 s after the pods' deletion: pods %q; %v", left, held)
	}
}

// webService is Service web: a NodePort in front of the pods of app web.
func webService() map[string]any {
	return map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": "web", "namespace": "default"},
		"spec": map[string]any{
			"type": "NodePort", "selector": map[string]string{"app": "web"},
			"ports": []map[string]any{{"port": servicePort, "targetPort": 8080, "nodePort": nodePort, "protocol": "TCP"}},
		},
	}
}

// pinned renames Deployment d (its name, its pods' app label and the
// name its server answers as) and pins its pods to node.
func pinned(d map[string]any, name, node string) map[string]any {
	d["metadata"].(map[string]any)["name"] = name
	spec := d["spec"].(map[string]any)
	spec["selector"] = map[string]any{"matchLabels": map[string]string{"app": name}}
	tmpl := spec["template"].(map[string]any)
	tmpl["metadata"] = map[string]any{"labels": map[string]string{"app": name}}
	pod := tmpl["spec"].(map[string]any)
	pod["nodeSelector"] = map[string]string{"kubernetes.io/hostname": node}
	// its server answers as name
	pod["containers"].([]any)[0].(map[string]any)["args"] = []string{"serve", name, "8080"}
	return d
}

// podClient is the node's pod of app, as a client: the network namespace
// containerd made for its sandbox (containerd 1.6's libcni does not cache
// it), the one that holds the pod's address.
func (n *node) podClient(t *testing.T, c *controlPlane, app string) *nettest.Client {
	t.Helper()
	path := n.podNetns(t, c, app)
	podNS, err := ns.GetNS(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { podNS.Close() })
	return &nettest.Client{NS: podNS}
}

// podNetns is the path of the sandbox namespace of the node's pod of app.
func (n *node) podNetns(t *testing.T, c *controlPlane, app string) string {
	t.Helper()
	// the kubelet reports the address some time after the pod answers
	var ip net.IP
	nettest.Eventually(30*time.Second, func() bool {
		out, _ := c.kubectl("get", "pods", "-l", "app="+app, "--field-selector", "spec.nodeName="+n.name,
			"-o", "jsonpath={.items[*].status.podIP}")
		ip = net.ParseIP(out) // one pod, one address
		return ip != nil
	})
	for _, path := range n.sandboxes() {
		podNS, err := ns.GetNS(path)
		if err != nil {
			continue
		}
		found := false
		_ = podNS.Do(func(ns.NetNS) error {
			addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
			for _, a := range addrs {
				found = found || a.IP.Equal(ip)
			}
			return err
		})
		podNS.Close()
		if found {
			return path
		}
	}
	t.Fatalf("none of %s's sandbox namespaces %v holds the address %s of app %s's pod", n.name, n.sandboxes(), ip, app)
	return ""
}
