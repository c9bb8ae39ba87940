//go:build kube

package kube

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/portmap-dev/portmap/test/nettest"
)

// TestKubeProxy: kube-proxy of the suite's release on the cluster's node,
// once in its iptables mode and once in its nftables mode, writing its
// rules beside ours. With each of our backends a Deployment's pod with a
// host port, and a NodePort Service in front of it, answer: the host port
// from the LAN client (which the pod sees as itself: no masquerade on
// that path), from the node's address and from 127.0.0.1, and from the
// pod itself through the node's address (hairpin); the Service at its
// ClusterIP from the node and at its NodePort from the LAN client.
// Deleting the Deployment leaves no mapping. Then `externalSetMarkChain:
// KUBE-MARK-MASQ`: in iptables mode the hairpin and localhost connections
// are marked by kube-proxy's chain and masqueraded by kube-proxy's rule;
// in nftables mode, where iptables has no such chain, the pod's sandbox
// fails with the plugin's error naming the key, and a pod without host
// ports starts as usual.
func TestKubeProxy(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) { kubeProxy(t, mode) })
	}
}

// Service web's ports: the ClusterIP's and the node's.
const (
	servicePort = 80
	nodePort    = 30080
	webHostPort = 18300
)

var webPort = port{ContainerPort: 8080, HostPort: webHostPort, Protocol: "TCP"}

func kubeProxy(t *testing.T, mode string) {
	cl := nettest.NewClient(t, clientNet)
	node4 := cl.HostIP[0].String()
	at := func(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
	n, c := startClusterNode(t, containerd16, node4)
	n.setNetwork(t, map[string]any{"backend": "iptables"})
	c.waitReady(t, n)
	// the Services' range is routed as a node's default route would: the
	// node reaches a ClusterIP through kube-proxy's DNAT
	if out, err := exec.Command("ip", "route", "add", serviceRange, "dev", clientNet.HostIf).CombinedOutput(); err != nil {
		t.Fatalf("ip route add %s: %v %s", serviceRange, err, out)
	}
	start := time.Now()
	n.control = append(n.control, n.daemon(t, "kube-proxy", kubeBin("kube-proxy"),
		"--kubeconfig", c.kubeconfig, "--proxy-mode", mode, "--hostname-override", "node1",
		"--cluster-cidr", podV4, "--nodeport-addresses", node4+"/32",
		// the conntrack table's size and timeouts stay as the machine
		// has them (nf_conntrack_max and hashsize are the machine's)
		"--conntrack-max-per-core", "0", "--conntrack-min", "0",
		"--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256"))
	if !nettest.Eventually(60*time.Second, func() bool { return httpOK("http://127.0.0.1:10256/healthz") }) {
		t.Fatalf("kube-proxy (%s mode) not healthy 60 s after its start:\n%s", mode, n.log("kube-proxy"))
	}
	t.Logf("kube-proxy in %s mode healthy %s after its start", mode, time.Since(start).Round(100*time.Millisecond))
	c.apply(t, n, "service", map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": "web", "namespace": "default"},
		"spec": map[string]any{
			"type": "NodePort", "selector": map[string]string{"app": "web"},
			"ports": []map[string]any{{"port": servicePort, "targetPort": 8080, "nodePort": nodePort, "protocol": "TCP"}},
		},
	})
	clusterIP := c.mustKubectl(t, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")
	who := "web sees "

	for _, backend := range backends {
		n.setNetwork(t, map[string]any{"backend": backend})
		start := time.Now()
		c.apply(t, n, "web", webDeployment(webPort))
		reply(t, cl, "tcp", at(node4, webHostPort), who+cl.IP[0].String(), 90*time.Second)
		t.Logf("%s mode, %s backend: the pod answered on its host port %s after kubectl apply", mode, backend, time.Since(start).Round(100*time.Millisecond))
		reply(t, cl, "tcp", at(node4, nodePort), who, 30*time.Second)
		reply(t, nil, "tcp", at(clusterIP, servicePort), who, 10*time.Second)
		reply(t, nil, "tcp", at(node4, webHostPort), who, 5*time.Second)
		reply(t, nil, "tcp", at("127.0.0.1", webHostPort), who, 5*time.Second)
		reply(t, podClient(t), "tcp", at(node4, webHostPort), who, 5*time.Second)
		c.deleteWeb(t)
		refused(t, cl, "tcp", at(node4, webHostPort))
	}

	n.setNetwork(t, map[string]any{"backend": "iptables", "externalSetMarkChain": "KUBE-MARK-MASQ"})
	if mode == "iptables" {
		start := time.Now()
		c.apply(t, n, "web", webDeployment(webPort))
		reply(t, cl, "tcp", at(node4, webHostPort), who+cl.IP[0].String(), 90*time.Second)
		t.Logf("externalSetMarkChain: the pod answered on its host port %s after kubectl apply", time.Since(start).Round(100*time.Millisecond))
		// hairpin and localhost connections are masqueraded: the pod sees
		// the bridge's address, not its own or 127.0.0.1
		for _, from := range []*nettest.Client{podClient(t), nil} {
			addr := at(node4, webHostPort)
			if from == nil {
				addr = at("127.0.0.1", webHostPort)
			}
			if got := reply(t, from, "tcp", addr, who, 5*time.Second); strings.Contains(got, "127.0.0.1") {
				t.Errorf("%s answered %q: not masqueraded", addr, got)
			}
		}
		save, err := exec.Command("iptables-save", "-t", "nat").Output()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(save), "-j KUBE-MARK-MASQ") || strings.Contains(string(save), "-j CNI-HOSTPORT-SETMARK") {
			t.Errorf("the nat table after ADD with externalSetMarkChain: want jumps to KUBE-MARK-MASQ and none to CNI-HOSTPORT-SETMARK\n%s", save)
		}
		c.deleteWeb(t)
		if save, _ := exec.Command("iptables-save", "-t", "nat").Output(); !strings.Contains(string(save), ":KUBE-MARK-MASQ") {
			t.Errorf("DEL took kube-proxy's KUBE-MARK-MASQ chain with it:\n%s", save)
		}
		return
	}
	// nftables mode: kube-proxy keeps its masquerade mark in its own table
	c.apply(t, n, "web", webDeployment(webPort))
	const want = `invalid externalSetMarkChain "KUBE-MARK-MASQ"`
	var events string
	if !nettest.Eventually(90*time.Second, func() bool {
		events, _ = c.kubectl("get", "events", "--field-selector", "reason=FailedCreatePodSandBox", "-o", "jsonpath={.items[*].message}")
		return strings.Contains(events, want)
	}) {
		t.Fatalf("no FailedCreatePodSandBox event with %q 90 s after kubectl apply: %q\n%s", want, events, n.log("kubelet"))
	}
	if !strings.Contains(events, "nftables mode") || !strings.Contains(events, "remove the key") {
		t.Errorf("the sandbox's error does not say why and what to do: %q", events)
	}
	c.deleteWeb(t)
	plain := webDeployment()
	plain["metadata"].(map[string]any)["name"] = "plain"
	c.apply(t, n, "plain", plain)
	if out, err := c.kubectl("rollout", "status", "deployment/plain", "--timeout=90s"); err != nil {
		t.Errorf("a pod without host ports beside externalSetMarkChain: %v\n%s", err, out)
	}
	c.mustKubectl(t, "delete", "deployment", "plain", "--wait=true", "--timeout=60s")
}

// webDeployment is Deployment web: one pod serving on 8080, with ports.
func webDeployment(ports ...port) map[string]any {
	return map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "web", "namespace": "default"},
		"spec": map[string]any{
			"replicas": 1,
			"selector": map[string]any{"matchLabels": map[string]string{"app": "web"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]string{"app": "web"}},
				"spec": map[string]any{
					"terminationGracePeriodSeconds": 1,
					"containers": []any{map[string]any{
						"name": "server", "image": serverImage, "imagePullPolicy": "Never",
						"args": []string{"serve", "web", "8080"}, "ports": ports,
					}},
				},
			},
		},
	}
}

// apply writes manifest to a file of the node's and applies it.
func (c *controlPlane) apply(t *testing.T, n *node, name string, manifest map[string]any) {
	t.Helper()
	data, _ := json.Marshal(manifest)
	file := filepath.Join(n.dir, name+".json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	c.mustKubectl(t, "apply", "-f", file)
}

// deleteWeb deletes Deployment web and waits until its pod is gone and
// the node holds no mapping and no cache entry of it.
func (c *controlPlane) deleteWeb(t *testing.T) {
	t.Helper()
	c.mustKubectl(t, "delete", "deployment", "web", "--wait=true", "--timeout=60s")
	var left string
	if !nettest.Eventually(60*time.Second, func() bool {
		left, _ = c.kubectl("get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.name}")
		return left == "" && len(portmapList(t)) == 0 && len(cached()) == 0
	}) {
		t.Fatalf("60 s after Deployment web's deletion: pods %q, mappings %v, cache %v", left, portmapList(t), cached())
	}
}

// podClient is the only pod of the node, as a client: the network
// namespace containerd made for its sandbox (containerd 1.6's libcni
// does not cache it).
func podClient(t *testing.T) *nettest.Client {
	t.Helper()
	sandboxes, err := filepath.Glob("/run/netns/cni-*")
	if err != nil || len(sandboxes) != 1 {
		t.Fatalf("the node's sandbox namespaces %v %v, want one pod's", sandboxes, err)
	}
	podNS, err := ns.GetNS(sandboxes[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { podNS.Close() })
	return &nettest.Client{NS: podNS}
}
