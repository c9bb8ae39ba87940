//go:build kube

package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
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
// are marked by kube-proxy's chain and masqueraded by kube-proxy's rule,
// and CHECK, sync and GC keep to it (externalMarkVerbs); in nftables
// mode, where iptables has no such chain, the pod's sandbox fails with
// the plugin's error naming the key, a pod without host ports starts as
// usual, and STATUS says ADD can be served.
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
	n.startKubeProxy(t, mode, node4, podV4)
	if !nettest.Eventually(60*time.Second, func() bool { return httpOK("http://127.0.0.1:10256/healthz") }) {
		t.Fatalf("kube-proxy (%s mode) not healthy 60 s after its start:\n%s", mode, n.log("kube-proxy"))
	}
	t.Logf("kube-proxy in %s mode healthy %s after its start", mode, time.Since(start).Round(100*time.Millisecond))
	c.apply(t, n, "service", webService())
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
		reply(t, n.podClient(t, c, "web"), "tcp", at(node4, webHostPort), who, 5*time.Second)
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
		for _, from := range []*nettest.Client{n.podClient(t, c, "web"), nil} {
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
		externalMarkVerbs(t, c, n, cl, at(node4, webHostPort))
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
	// STATUS says ADD can be served: it can, without host ports (plain's
	// pod); with them the configuration is wrong, which ADD's error says
	// (a failed STATUS would make the node NotReady, and no pod start).
	// The runtime's conflist is CNI 1.0.0: asked as 1.1.0, as containerd
	// 2 asks.
	list, err := libcni.ConfListFromFile(filepath.Join(n.cniConf, "10-kube.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	list.CNIVersion = "1.1.0"
	if err := libcni.NewCNIConfig([]string{n.cniBin}, nil).GetStatusNetworkList(context.Background(), list); err != nil {
		t.Errorf("STATUS beside nftables-mode kube-proxy with externalSetMarkChain: %v", err)
	}
	c.mustKubectl(t, "delete", "deployment", "plain", "--wait=true", "--timeout=60s")
	c.waitGone(t, n)
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

// externalMarkVerbs: CHECK, sync and GC of the pod's attachment with
// externalSetMarkChain beside iptables-mode kube-proxy, through libcni
// over the node's conflist, plugins and cache, as containerd's go-cni
// runs them. CHECK passes; after a flush of the pod's DNAT chain it
// fails, one `portmap-agent sync` pass repairs the chain (its jump to
// KUBE-MARK-MASQ with it) and CHECK passes again; GC with the pod as the
// only valid attachment collects an attachment whose runtime lost its
// cache entry, and leaves the pod's rules and kube-proxy's chain.
func externalMarkVerbs(t *testing.T, c *controlPlane, n *node, cl *nettest.Client, addr string) {
	t.Helper()
	ctx := context.Background()
	list, err := libcni.ConfListFromFile(filepath.Join(n.cniConf, "10-kube.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.cniBin}, "/var/lib/cni", nil)
	// CHECK asks portmap alone, with the prevResult libcni cached for the
	// whole list: bridge's CHECK fails on containerd 1.6's cached result,
	// whose interfaces name no sandbox
	portmapOnly := *list
	portmapOnly.Plugins = list.Plugins[len(list.Plugins)-1:]
	entries := cached()
	if len(entries) != 1 {
		t.Fatalf("the node's cache entries %v, want one pod's", entries)
	}
	id := strings.TrimSuffix(strings.TrimPrefix(entries[0], "kube-"), "-eth0")
	caps := func(port int) map[string]any {
		return map[string]any{"portMappings": []nettest.Mapping{{HostPort: port, ContainerPort: 8080, Protocol: "tcp"}}}
	}
	pod := &libcni.RuntimeConf{ContainerID: id, NetNS: n.podNetns(t, c, "web"), IfName: "eth0", CapabilityArgs: caps(webHostPort)}
	if err := cni.CheckNetworkList(ctx, &portmapOnly, pod); err != nil {
		t.Errorf("CHECK of the pod's attachment: %v", err)
	}
	save := func() string {
		t.Helper()
		out, err := exec.Command("iptables-save", "-t", "nat").Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	var chain string
	for _, l := range strings.Split(save(), "\n") {
		if name, ok := strings.CutPrefix(l, ":CNI-DN-"); ok {
			chain = "CNI-DN-" + strings.Fields(name)[0]
		}
	}
	if out, err := exec.Command("iptables", "-t", "nat", "-F", chain).CombinedOutput(); chain == "" || err != nil {
		t.Fatalf("flush the pod's chain %q: %v %s", chain, err, out)
	}
	if err := cni.CheckNetworkList(ctx, &portmapOnly, pod); err == nil {
		t.Errorf("CHECK passed after a flush of the pod's chain %s", chain)
	}
	out, stderr, status, err := nettest.Agent("sync")
	if err != nil || status != 0 || !strings.Contains(out, "repaired") {
		t.Errorf("portmap-agent sync after the flush: exit %d %v, want a repair\n%s%s", status, err, out, stderr)
	}
	if err := cni.CheckNetworkList(ctx, &portmapOnly, pod); err != nil {
		t.Errorf("CHECK after sync: %v", err)
	}
	if rules := save(); !strings.Contains(rules, "-A "+chain+" ") || !strings.Contains(rules, "-j KUBE-MARK-MASQ") {
		t.Errorf("sync did not bring back %s with its jump to KUBE-MARK-MASQ:\n%s", chain, rules)
	}
	reply(t, cl, "tcp", addr, "web sees "+cl.IP[0].String(), 5*time.Second)

	// GC runs where the conflist is CNI 1.1.0 (the runtime's here is
	// 1.0.0: libcni sends GC to the plugins from 1.1.0)
	list.CNIVersion = "1.1.0"
	const stalePort = 18399
	staleNS := nettest.NewNS(t)
	stale := &libcni.RuntimeConf{ContainerID: "stale", NetNS: staleNS.Path(), IfName: "eth0", CapabilityArgs: caps(stalePort)}
	if _, err := cni.AddNetworkList(ctx, list, stale); err != nil {
		t.Fatalf("ADD of a second attachment: %v", err)
	}
	if err := os.Remove("/var/lib/cni/results/kube-stale-eth0"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(save(), fmt.Sprint(stalePort)) {
		t.Fatalf("the second attachment's host port %d is not in the nat table", stalePort)
	}
	valid := &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: id, IfName: "eth0"}}}
	if err := cni.GCNetworkList(ctx, list, valid); err != nil {
		t.Errorf("GC: %v", err)
	}
	rules := save()
	if strings.Contains(rules, fmt.Sprint(stalePort)) || !strings.Contains(rules, "-A "+chain+" ") || !strings.Contains(rules, ":KUBE-MARK-MASQ") {
		t.Errorf("after GC with the pod's attachment valid: want no host port %d, the pod's %s and kube-proxy's KUBE-MARK-MASQ\n%s", stalePort, chain, rules)
	}
	if err := cni.CheckNetworkList(ctx, &portmapOnly, pod); err != nil {
		t.Errorf("CHECK after GC: %v", err)
	}
	reply(t, cl, "tcp", addr, "web sees "+cl.IP[0].String(), 5*time.Second)
}
