//go:build kube

package kube

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/portmap-dev/portmap/pkg/backend/socket"
	"github.com/portmap-dev/portmap/test/deploy"
	"github.com/portmap-dev/portmap/test/nettest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The node's link to its client, a machine on its LAN.
var clientNet = nettest.ClientNet{HostIf: "kc0", V4: "198.51.120", V6: "2001:db8:120:"}

var backends = []string{"iptables", "nftables"}

// networks are the node networks pods run on: each backend, and
// nftables with the node's localhost served by the socket path.
var networks = []struct {
	name, backend string
	socket        bool
}{{"iptables", "iptables", false}, {"nftables", "nftables", false}, {"nftables-socket", "nftables", true}}

// reply sends one request and waits, up to d, for an answer that starts
// with want (a pod comes up some time after its manifest appears).
func reply(t *testing.T, from *nettest.Client, proto, addr, want string, d time.Duration) string {
	t.Helper()
	var got string
	var err error
	var in ns.NetNS // nil: the node
	if from != nil {
		in = from.NS
	}
	nettest.Eventually(d, func() bool {
		got, err = nettest.Dial(in, proto, addr)
		return err == nil && strings.HasPrefix(got, want)
	})
	if err != nil || !strings.HasPrefix(got, want) {
		t.Errorf("%s %s: %q %v, want a reply from %s", proto, addr, got, err, want)
	}
	return got
}

// refused checks that addr answers nothing within a few tries.
func refused(t *testing.T, from *nettest.Client, proto, addr string) {
	t.Helper()
	got, err := nettest.Dial(from.NS, proto, addr)
	if err == nil {
		t.Errorf("%s %s answered %q after the pod's end", proto, addr, got)
	}
}

// TestHostPortPods: static pods with host ports, run by the kubelet
// through containerd's CRI and this plugin (both backends, and the socket
// path for the node's localhost): TCP and UDP, IPv4 and IPv6, a hostIP,
// reached from a client on the node's LAN, from the node and from
// 127.0.0.1 (and [::1] through the socket path); a kubelet restart and a
// containerd restart keep the running pod (its sandbox) and its host
// ports; deleting the pod removes its mappings, its libcni cache entry
// and its lease.
func TestHostPortPods(t *testing.T) {
	cl := nettest.NewClient(t, clientNet)
	n := startNode(t, containerd16)
	node4, node6 := cl.HostIP[0].String(), cl.HostIP[1].String()
	at := func(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
	for _, v := range networks {
		t.Run(v.name, func(t *testing.T) {
			keys := map[string]any{"backend": v.backend}
			var site *nettest.CgroupSite
			if v.socket {
				site = nettest.NewCgroupSite(t)
				keys["localhost"], keys["cgroupPath"], keys["bpfPinDir"] = "socket", site.Cgroup, site.PinDir
			}
			n.setNetwork(t, keys)
			start := time.Now()
			n.run(t, pod{Name: "web", Ports: []port{
				{ContainerPort: 8080, HostPort: 18080, Protocol: "TCP"},
				{ContainerPort: 8080, HostPort: 18080, Protocol: "UDP"},
				{ContainerPort: 8080, HostPort: 18081, Protocol: "TCP", HostIP: node4},
				{ContainerPort: 8080, HostPort: 18082, Protocol: "UDP", HostIP: node6},
			}})
			who := "web sees "
			reply(t, cl, "tcp", at(node4, 18080), who+cl.IP[0].String(), 90*time.Second)
			t.Logf("%s: the pod answered through its host port %s after its manifest appeared", v.name, time.Since(start).Round(100*time.Millisecond))
			reply(t, cl, "udp", at(node4, 18080), who+cl.IP[0].String(), 5*time.Second)
			reply(t, cl, "tcp", at(node6, 18080), who+cl.IP[1].String(), 5*time.Second)
			reply(t, cl, "udp", at(node6, 18080), who+cl.IP[1].String(), 5*time.Second)
			reply(t, cl, "tcp", at(node4, 18081), who+cl.IP[0].String(), 5*time.Second)
			reply(t, cl, "udp", at(node6, 18082), who+cl.IP[1].String(), 5*time.Second)
			reply(t, nil, "tcp", at(node4, 18080), who, 5*time.Second)
			if v.socket {
				for _, proto := range []string{"tcp", "udp"} {
					for _, a := range []string{at("127.0.0.1", 18080), at("::1", 18080)} {
						if res, err := site.Client(proto, a, false); err != nil || !strings.HasPrefix(res.Reply, who) || res.Peer != a {
							t.Errorf("%s %s from the node's cgroup: %+v %v, want the pod, peer %s", proto, a, res, err, a)
						}
					}
				}
			} else {
				reply(t, nil, "tcp", at("127.0.0.1", 18080), who, 5*time.Second)
			}
			if got := len(portmapList(t)); got == 0 {
				t.Errorf("portmap-agent list shows no mapping of the pod")
			}
			sandbox := cached()
			if len(sandbox) != 1 || len(leases()) != 2 {
				t.Errorf("libcni cache %v and leases %v, want the pod's one entry and two addresses", sandbox, leases())
			}

			for _, d := range []string{"kubelet", "containerd"} {
				n.restart(t, d)
				reply(t, cl, "tcp", at(node4, 18080), who+cl.IP[0].String(), 5*time.Second)
				reply(t, cl, "udp", at(node6, 18080), who+cl.IP[1].String(), 5*time.Second)
				if got := cached(); strings.Join(got, " ") != strings.Join(sandbox, " ") {
					t.Errorf("after a %s restart the cache holds %v, want the same sandbox %v", d, got, sandbox)
				}
			}

			n.remove(t, "web")
			if !nettest.Eventually(60*time.Second, func() bool { return len(portmapList(t)) == 0 && len(cached()) == 0 && len(leases()) == 0 }) {
				t.Fatalf("60 s after the pod's manifest was removed: mappings %v, cache %v, leases %v", portmapList(t), cached(), leases())
			}
			for _, a := range []string{at(node4, 18080), at(node6, 18080), at(node4, 18081)} {
				refused(t, cl, "tcp", a)
			}
			refused(t, cl, "udp", at(node6, 18082))
			if v.socket {
				if res, err := site.Client("tcp", at("127.0.0.1", 18080), false); err == nil {
					t.Errorf("127.0.0.1:18080 from the node's cgroup answered %q after the pod's end", res.Reply)
				}
			}
		})
	}
}

// TestHostPortConflict: a second pod asking for a host port a running
// pod has is rejected by the kubelet itself (its NodePorts admission), so
// it never reaches the plugin. A host port held on the node by another
// runtime (a container ADDed through libcni beside the kubelet, as
// Podman's would be) is where hostPortConflict decides: with "replace"
// (the default) the kubelet's pod gets the port; with "reject" its
// sandbox fails with the plugin's error (the kubelet retries it) and the
// other container keeps the port.
func TestHostPortConflict(t *testing.T) {
	cl := nettest.NewClient(t, clientNet)
	n := startNode(t, containerd16)
	addr := net.JoinHostPort(cl.HostIP[0].String(), "18200")
	ports := []port{{ContainerPort: 8080, HostPort: 18200, Protocol: "TCP"}}

	n.setNetwork(t, map[string]any{"backend": "nftables"})
	n.run(t, pod{Name: "first", Ports: ports})
	reply(t, cl, "tcp", addr, "first sees ", 90*time.Second)
	mark := n.logMark("kubelet")
	n.run(t, pod{Name: "second", Ports: ports})
	if !nettest.Eventually(30*time.Second, func() bool { return n.status("second-node1").Phase == "Failed" }) {
		t.Errorf("the second pod asking for the first's host port: %+v, want it Failed (rejected by the kubelet)", n.status("second-node1"))
	}
	if !n.logHas("kubelet", mark, "NodePorts") {
		t.Errorf("the kubelet does not name its NodePorts admission for the second pod")
	}
	reply(t, cl, "tcp", addr, "first sees ", 5*time.Second)
	n.remove(t, "second")
	n.remove(t, "first")
	if !nettest.Eventually(60*time.Second, func() bool { return len(portmapList(t)) == 0 && len(cached()) == 0 }) {
		t.Fatalf("60 s after both pods were removed: mappings %v, cache %v", portmapList(t), cached())
	}

	for _, b := range backends {
		for _, policy := range []string{"replace", "reject"} {
			t.Run(b+"-"+policy, func(t *testing.T) {
				keys := map[string]string{"backend": fmt.Sprintf("%q", b), "hostPortConflict": fmt.Sprintf("%q", policy)}
				other := nettest.NewRuntime(t, nettest.Net{Name: "other", V4: "192.0.2.0/28", Extra: keys})
				c := other.MustAdd(t, "other", nettest.Mapping{HostPort: 18200, ContainerPort: 8080})
				nettest.Serve(t, c.NS, "other", 8080)
				reply(t, cl, "tcp", addr, "other sees ", 5*time.Second)

				n.setNetwork(t, map[string]any{"backend": b, "hostPortConflict": policy})
				name := "kube-" + b + "-" + policy
				mark := n.logMark("kubelet")
				n.run(t, pod{Name: name, Ports: ports})
				if policy == "replace" {
					reply(t, cl, "tcp", addr, name+" sees ", 90*time.Second)
				} else {
					want := `is already mapped by network`
					if !nettest.Eventually(60*time.Second, func() bool { return n.logHas("kubelet", mark, want) }) {
						t.Errorf("the kubelet logs no sandbox failure naming the policy (%s) 60 s after the pod appeared", want)
					}
					reply(t, cl, "tcp", addr, "other sees ", 5*time.Second)
					if s := n.status(name + "-node1"); s.Phase == "Running" {
						t.Errorf("the pod runs: %+v", s)
					}
				}
				n.remove(t, name)
				if !nettest.Eventually(60*time.Second, func() bool { return len(cached()) == 0 }) {
					t.Fatalf("60 s after the pod was removed: cache %v", cached())
				}
				if err := other.Del(c); err != nil {
					t.Fatal(err)
				}
				if got := portmapList(t); len(got) != 0 {
					t.Errorf("mappings left: %v", got)
				}
				refused(t, cl, "tcp", addr)
			})
		}
	}
}

// flushes are the firewall flushes of an operator, by backend.
var flushes = map[string][][]string{
	"iptables": {{"iptables", "-t", "nat", "-F"}, {"ip6tables", "-t", "nat", "-F"}},
	"nftables": {{"nft", "flush", "ruleset"}},
}

// TestDaemonSet runs deploy/portmap.yaml's pod template (decoded from the
// file, not a copy) as a static pod: its init container installs the
// plugin into the CNI bin directory containerd uses, and pods started
// after it run that binary; the kubelet judges the agent's probes (the
// pod becomes Ready, and is never restarted); a firewall flush is
// repaired by the agent and the host port answers again; pod churn with
// the agent running leaves no mapping behind; an update of the
// DaemonSet's pod (a rolling update, on this node) keeps a running pod's
// host port answering throughout. On a node whose localhost takes the
// socket path at its default site (the node's root cgroup, pins under
// /sys/fs/bpf), the node's 127.0.0.1 and [::1] reach the pod, and the
// agent repairs a link removed with the flush.
func TestDaemonSet(t *testing.T) {
	ds, err := deploy.Read()
	if err != nil {
		t.Fatal(err)
	}
	cl := nettest.NewClient(t, clientNet)
	n := startNode(t, containerd16)
	node4 := cl.HostIP[0].String()
	at := func(port int) string { return net.JoinHostPort(node4, fmt.Sprint(port)) }
	image := ds.Spec.Template.Spec.InitContainers[0].Image
	plugin := n.importDaemonSetImage(t, image)
	want, err := os.ReadFile(plugin)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range networks {
		b := v.backend
		t.Run(v.name, func(t *testing.T) {
			keys := map[string]any{"backend": b}
			// The socket path at its default site: no cgroupPath, no
			// bpfPinDir. The node's root cgroup is the suite's (its cgroup
			// namespace), so what attaches there serves the node's
			// processes and the test's clients, in a cgroup below it.
			var site *nettest.CgroupSite
			if v.socket {
				keys["localhost"] = "socket"
				site = nettest.NewCgroupSite(t)
			}
			n.setNetwork(t, keys)
			installed := filepath.Join(n.cniBin, "portmap")
			if err := os.Remove(installed); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			agent := corev1.Pod{
				TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				// A static pod's UID is its manifest's hash: an annotation
				// of its own per subtest, so no status of the last one is
				// taken for this one's.
				ObjectMeta: metav1.ObjectMeta{Name: ds.Name, Namespace: ds.Namespace, Labels: ds.Spec.Template.Labels,
					Annotations: map[string]string{"portmap.test/network": v.name}},
				Spec: ds.Spec.Template.Spec,
			}
			n.runManifest(t, ds.Name, agent)
			name := ds.Name + "-node1"
			start := time.Now()
			if !nettest.Eventually(60*time.Second, func() bool { return n.status(name).Ready }) {
				t.Fatalf("the DaemonSet's pod is not Ready 60 s after its manifest appeared: %+v", n.status(name))
			}
			t.Logf("%s: the DaemonSet's pod Ready %s after its manifest appeared", v.name, time.Since(start).Round(100*time.Millisecond))
			// As on a unified hierarchy, the pod has a cgroup namespace of
			// its own (runcCgroupNS): the agent finds the node's hierarchy
			// from there.
			if pid, err := agentPID(); err != nil {
				t.Error(err)
			} else if own, theirs := nsOf("self"), nsOf(pid); own == "" || theirs == "" || own == theirs {
				t.Errorf("the agent (pid %s) runs in cgroup namespace %q, the node in %q: want one of its own", pid, theirs, own)
			}
			got, err := os.ReadFile(installed)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s after the init container: %d bytes %v, want the image's plugin (%d bytes)", installed, len(got), err, len(want))
			}

			n.run(t, pod{Name: "web", Ports: []port{{ContainerPort: 8080, HostPort: 18090, Protocol: "TCP"}}})
			who := "web sees " + cl.IP[0].String()
			reply(t, cl, "tcp", at(18090), who, 90*time.Second)
			// From the node: through the socket path, [::1] too (NAT
			// serves only 127.0.0.1), and no NAT rule for 127.0.0.1.
			viaSocket := func() error {
				for _, a := range []string{net.JoinHostPort("127.0.0.1", "18090"), net.JoinHostPort("::1", "18090")} {
					if res, err := site.Client("tcp", a, false); err != nil || !strings.HasPrefix(res.Reply, "web sees ") || res.Peer != a {
						return fmt.Errorf("%s from the node's cgroup: %+v %v, want the pod, peer %s", a, res, err, a)
					}
				}
				return nil
			}
			connect4 := filepath.Join(socket.DefaultPinDir, "v1", "connect4")
			if v.socket {
				if err := viaSocket(); err != nil {
					t.Error(err)
				}
				if _, err := os.Stat(connect4); err != nil {
					t.Errorf("ADD at the default site pinned no link: %v", err)
				}
				if out, err := exec.Command("nft", "list", "ruleset").CombinedOutput(); err != nil || strings.Contains(string(out), "127.0.0.1") {
					t.Errorf("nft list ruleset: %v, want no rule for 127.0.0.1 (the socket path serves it):\n%s", err, out)
				}
				// Removed with the flush: the pass the flush wakes repairs both.
				if err := os.Remove(connect4); err != nil {
					t.Fatal(err)
				}
			}

			for _, c := range flushes[b] {
				if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v\n%s", c, err, out)
				}
			}
			start = time.Now()
			reply(t, cl, "tcp", at(18090), who, 15*time.Second)
			t.Logf("%s: the host port answered again %s after %v", v.name, time.Since(start).Round(100*time.Millisecond), flushes[b])
			if v.socket {
				var err error
				if !nettest.Eventually(15*time.Second, func() bool { err = viaSocket(); return err == nil }) {
					t.Errorf("15 s after connect4 was removed and the ruleset flushed: %v", err)
				}
				if shared := metric(t, "http://127.0.0.1:9765/metrics", `portmap_agent_repairs_total{kind="shared"}`); shared < 1 {
					t.Errorf("the agent counts %v shared repairs after connect4 was removed, want at least 1", shared)
				}
			}
			// The agent did it: nothing else writes rules without an ADD.
			// It counts a repair when its pass has ended, which may be just
			// after the write that let the reply through.
			var repairs float64
			if !nettest.Eventually(5*time.Second, func() bool {
				repairs = metric(t, "http://127.0.0.1:9765/metrics", `portmap_agent_repairs_total{kind="attachment"}`)
				return repairs >= 1
			}) {
				t.Errorf("the agent counts %v attachment repairs 5 s after the host port answered again, want at least 1", repairs)
			}

			// Churn beside the agent: pods come and go, some at once.
			for round := 0; round < 3; round++ {
				names := []string{fmt.Sprintf("churn%da", round), fmt.Sprintf("churn%db", round)}
				for i, p := range names {
					n.run(t, pod{Name: p, Ports: []port{{ContainerPort: 8080, HostPort: 18100 + 2*round + i, Protocol: "TCP"}}})
				}
				for i, p := range names {
					reply(t, cl, "tcp", at(18100+2*round+i), p+" sees ", 90*time.Second)
				}
				for _, p := range names {
					n.remove(t, p)
				}
			}
			// An update of the DaemonSet's pod, what a rolling update does
			// on this node (the old pod ends, the new one starts), leaves
			// the running pods' host ports as they are throughout.
			agent.Annotations["portmap.test/revision"] = "2"
			n.runManifest(t, ds.Name, agent)
			start = time.Now()
			failed, tries := 0, 0
			var failures []string
			updated := nettest.Eventually(60*time.Second, func() bool {
				tries++
				if _, err := nettest.Dial(cl.NS, "tcp", at(18090)); err != nil {
					failed++
					if len(failures) < 3 {
						failures = append(failures, fmt.Sprintf("%s: %v", time.Since(start).Round(100*time.Millisecond), err))
					}
				}
				return n.status(name, "portmap.test/revision", "2").Ready
			})
			if !updated {
				t.Errorf("the updated DaemonSet pod is not Ready 60 s after its manifest changed")
			}
			if failed > 0 {
				t.Errorf("the running pod's host port failed %d of %d times while the DaemonSet's pod was updated, first %q", failed, tries, failures)
			}
			t.Logf("%s: the updated DaemonSet pod Ready %s after its manifest changed; the running pod's host port answered throughout", v.name, time.Since(start).Round(100*time.Millisecond))
			reply(t, cl, "tcp", at(18090), who, 5*time.Second)

			n.remove(t, "web")
			if !nettest.Eventually(60*time.Second, func() bool { return len(portmapList(t)) == 0 && len(cached()) == 0 }) {
				t.Errorf("60 s after the churn's pods were removed: mappings %v, cache %v", portmapList(t), cached())
			}
			for _, port := range []int{18090, 18100, 18101, 18102, 18103, 18104, 18105} {
				refused(t, cl, "tcp", at(port))
			}
			if v.socket {
				if res, err := site.Client("tcp", net.JoinHostPort("127.0.0.1", "18090"), false); err == nil {
					t.Errorf("127.0.0.1:18090 from the node's cgroup answered %q after the pod's end", res.Reply)
				}
			}
			if s := n.status(name, "portmap.test/revision", "2"); !s.Ready || s.Restarts != 0 {
				t.Errorf("the DaemonSet's pod after the churn: %+v, want Ready and never restarted", s)
			}
			n.remove(t, ds.Name)
			// Gone from the kubelet's list is not yet ended: the next
			// subtest's agent must not meet this one (two agents, one
			// metrics port, either repairing).
			if !nettest.Eventually(60*time.Second, func() bool {
				return !n.status(name).Found && len(n.tasks()) == 0 && !httpOK("http://127.0.0.1:9765/healthz")
			}) {
				t.Errorf("the DaemonSet's pod still runs 60 s after its manifest was removed: tasks %v", n.tasks())
			}
		})
	}
}

// agentPID is the process id of the node's one `portmap-agent sync`.
func agentPID() (string, error) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var found []string
	for _, p := range procs {
		args := strings.Split(readString(p), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "portmap-agent" && args[1] == "sync" {
			found = append(found, filepath.Base(filepath.Dir(p)))
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("portmap-agent sync processes: %v, want one", found)
	}
	return found[0], nil
}

// nsOf is the cgroup namespace of a process ("self" or a pid), "" when
// it cannot be read.
func nsOf(pid string) string {
	ns, _ := os.Readlink("/proc/" + pid + "/ns/cgroup")
	return ns
}

func readString(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// metric reads one sample (name with its labels, as exposed) from a
// Prometheus text page; -1 when it is not there.
func metric(t *testing.T, url, sample string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("get %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", url, l, err)
			}
			return f
		}
	}
	return -1
}

// notReady is what the kubelet says of a pod it will not start while the
// runtime reports NetworkReady=false (it asks the runtime every 5 s).
const notReady = "network is not ready"

// TestContainerd2: containerd 2.x, which asks every network's STATUS (CNI
// 1.1) for the runtime's NetworkReady condition, runs hostPort pods
// through the plugin on both backends. After a firewall flush the network
// stays ready (STATUS is 0 while ADD can be served): a new pod starts and
// answers through its host port, the kubelet never says the network is
// not ready, and `portmap-agent sync` brings the older pod's host port back. A
// STATUS that fails (the socket path with a cgroup that does not exist:
// code 50) does hold pods back, so the check above can fail.
func TestContainerd2(t *testing.T) {
	cl := nettest.NewClient(t, clientNet)
	n := startNode(t, containerd2)
	node4, node6 := cl.HostIP[0].String(), cl.HostIP[1].String()
	at := func(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			n.setNetwork(t, map[string]any{"backend": b})
			n.run(t, pod{Name: "web", Ports: []port{{ContainerPort: 8080, HostPort: 18300, Protocol: "TCP"}, {ContainerPort: 8080, HostPort: 18300, Protocol: "UDP"}}})
			who4, who6 := "web sees "+cl.IP[0].String(), "web sees "+cl.IP[1].String()
			reply(t, cl, "tcp", at(node4, 18300), who4, 90*time.Second)
			reply(t, cl, "udp", at(node6, 18300), who6, 5*time.Second)

			mark := n.logMark("kubelet")
			for _, c := range flushes[b] {
				if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v\n%s", c, err, out)
				}
			}
			time.Sleep(6 * time.Second) // one of the kubelet's runtime checks and more
			n.run(t, pod{Name: "after", Ports: []port{{ContainerPort: 8080, HostPort: 18301, Protocol: "TCP"}}})
			reply(t, cl, "tcp", at(node4, 18301), "after sees ", 90*time.Second)
			if n.logHas("kubelet", mark, notReady) {
				t.Errorf("after %v the kubelet held a pod back: %q", flushes[b], notReady)
			}
			if _, err := nettest.Dial(cl.NS, "tcp", at(node4, 18300)); err == nil {
				t.Errorf("the older pod's host port answers after %v: the flush removed nothing", flushes[b])
			}
			if out, stderr, status, err := nettest.Agent("sync", "--cache-dir", "/var/lib/cni"); err != nil || status != 0 {
				t.Fatalf("portmap-agent sync: exit %d %v\n%s%s", status, err, out, stderr)
			}
			reply(t, cl, "tcp", at(node4, 18300), who4, 5*time.Second)
			reply(t, cl, "udp", at(node6, 18300), who6, 5*time.Second)

			n.remove(t, "web")
			n.remove(t, "after")
			if !nettest.Eventually(60*time.Second, func() bool { return len(portmapList(t)) == 0 && len(cached()) == 0 && len(leases()) == 0 }) {
				t.Fatalf("60 s after the pods' manifests were removed: mappings %v, cache %v, leases %v", portmapList(t), cached(), leases())
			}
			refused(t, cl, "tcp", at(node4, 18300))
		})
	}
	t.Run("status-fails", func(t *testing.T) {
		mark := n.logMark("kubelet")
		n.setNetwork(t, map[string]any{"backend": "nftables", "localhost": "socket", "cgroupPath": "/nonexistent/cgroup"})
		time.Sleep(6 * time.Second)
		n.run(t, pod{Name: "held", Ports: []port{{ContainerPort: 8080, HostPort: 18302, Protocol: "TCP"}}})
		if !nettest.Eventually(30*time.Second, func() bool { return n.logHas("kubelet", mark, notReady) }) {
			t.Errorf("30 s with a STATUS that fails, and the kubelet never held a pod back (%q)", notReady)
		}
		if len(cached()) != 0 {
			t.Errorf("a sandbox was set up while STATUS failed: cache %v", cached())
		}
		n.setNetwork(t, map[string]any{"backend": "nftables"})
		reply(t, cl, "tcp", at(node4, 18302), "held sees ", 90*time.Second)
		n.remove(t, "held")
		if !nettest.Eventually(60*time.Second, func() bool { return len(portmapList(t)) == 0 && len(cached()) == 0 }) {
			t.Fatalf("60 s after the pod's manifest was removed: mappings %v, cache %v", portmapList(t), cached())
		}
	})
}
