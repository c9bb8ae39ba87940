//go:build kube

package kube

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/portmap-dev/portmap/test/nettest"
)

// peerEnv's value in childEnv marks the process that holds a second
// node's namespaces (holdPeer).
const peerEnv = "peer"

// holdPeer is the test binary holding a second node's network and mount
// namespaces, set up as the suite's own (setupNode: private mounts, its
// sysfs, shadowed sysctls, a tmpfs on every shadowed directory): it says
// so on stdout and waits for its stdin to close. The node's daemons
// enter its namespaces with nsenter; they share the suite's PID
// namespace, so they end with it.
func holdPeer() error {
	if err := setupNode(); err != nil {
		return err
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// lan is the cluster's LAN: a bridge in a namespace of the suite's own,
// with the nodes and a client on it.
type lan struct {
	ns     ns.NetNS
	client *nettest.Client
}

// The LAN's addresses: node1 .1, the client .2, node2 .3.
const (
	lanPrefix = "198.51.121"
	lanBridge = "lan0"
)

// newLAN makes the LAN's namespace and bridge and its client.
func newLAN(t *testing.T) *lan {
	t.Helper()
	l := &lan{ns: nettest.NewNS(t)}
	err := l.ns.Do(func(ns.NetNS) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: lanBridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	})
	if err != nil {
		t.Fatalf("the LAN's bridge: %v", err)
	}
	cl := nettest.NewNS(t)
	l.plug(t, "klc", cl)
	ip := lanPrefix + ".2"
	if err := cl.Do(func(ns.NetNS) error { return nettest.Configure("klc", []string{ip + "/24"}, nil) }); err != nil {
		t.Fatalf("the LAN's client: %v", err)
	}
	l.client = &nettest.Client{NS: cl, IP: []net.IP{net.ParseIP(ip)}}
	return l
}

// plug makes a veth pair, its end name in the namespace to (nil: this
// one) and its peer on the LAN's bridge.
func (l *lan) plug(t *testing.T, name string, to ns.NetNS) {
	t.Helper()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s: %v", name, err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	move := func(link string, fd int) {
		t.Helper()
		l, err := netlink.LinkByName(link)
		if err == nil {
			err = netlink.LinkSetNsFd(l, fd)
		}
		if err != nil {
			t.Fatalf("move %s: %v", link, err)
		}
	}
	move(name+"p", int(l.ns.Fd()))
	if to != nil {
		move(name, int(to.Fd()))
	}
	err := l.ns.Do(func(ns.NetNS) error {
		br, err := netlink.LinkByName(lanBridge)
		if err != nil {
			return err
		}
		p, err := netlink.LinkByName(name + "p")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(p, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(p)
	})
	if err != nil {
		t.Fatalf("%s on the LAN: %v", name, err)
	}
}

// startPeerNode starts a second node of c's cluster, named name, at ip on
// the LAN: a holder of new network and mount namespaces (holdPeer), its
// link to the LAN, a cgroup of its own under the suite's, containerd with
// the suite's images and a kubelet registered with c's API server
// through the LAN.
func startPeerNode(t *testing.T, c *controlPlane, l *lan, rt runtime, name, ip string) *node {
	t.Helper()
	cg := path.Join(os.Getenv(cgroupEnv), name)
	made, err := makeCgroup(cg)
	t.Cleanup(func() {
		if err := removeCgroup(made); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), childEnv+"="+peerEnv)
	holder.Stderr = os.Stderr
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatalf("start %s's holder: %v", name, err)
	}
	// ended by closing its stdin; killed should a test end before
	// prepare takes it over
	t.Cleanup(func() { stdin.Close(); _ = holder.Process.Kill() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("%s's holder: %q %v", name, line, err)
	}
	netNS, err := ns.GetNS(fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netNS.Close() })
	link := "kl" + strings.TrimPrefix(name, "node")
	l.plug(t, link, netNS)
	if err := netNS.Do(func(ns.NetNS) error { return nettest.Configure(link, []string{ip + "/24"}, nil) }); err != nil {
		t.Fatalf("%s's link: %v", name, err)
	}
	n := prepare(t, &node{name: name, cgroup: cg, rt: rt, peer: holder, link: link, netNS: netNS})
	kc := filepath.Join(n.dir, "kubeconfig")
	data, err := os.ReadFile(c.kubeconfig)
	if err == nil {
		err = os.WriteFile(kc, []byte(strings.Replace(string(data), "https://127.0.0.1:6443", "https://"+net.JoinHostPort(c.nodeIP, "6443"), 1)), 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	n.kubeconfig = kc
	n.kubeletArgs = []string{"--kubeconfig", kc, "--node-ip", ip}
	n.startKubelet(t)
	return n
}

// flanneldEnv names flanneld's binary (make flannel builds it).
const flanneldEnv = "PORTMAP_FLANNELD"

// startFlannel starts flanneld on the node (the Kubernetes subnet
// manager, VXLAN over the node's LAN link, its masquerade rules for the
// pods' traffic leaving the cluster network) and writes the conflist
// flannel's CNI plugin delegates to from its subnet.env, with portmap
// after it. The conflist is written again by setFlannelNetwork.
func (n *node) startFlannel(t *testing.T) {
	t.Helper()
	conf := filepath.Join(n.dir, "net-conf.json")
	if err := os.WriteFile(conf, []byte(`{"Network": "`+clusterCIDR+`", "Backend": {"Type": "vxlan"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	n.control = append(n.control, n.daemon(t, "flanneld", "env", "NODE_NAME="+n.name, os.Getenv(flanneldEnv),
		"--kube-subnet-mgr", "--kubeconfig-file", n.kubeconfig, "--iface", n.link, "--ip-masq",
		"--net-config-path", conf, "--subnet-file", "/run/flannel/subnet.env"))
}

// subnetEnv reads the node's /run/flannel/subnet.env, waiting up to 60 s
// for flanneld to write it.
func (n *node) subnetEnv(t *testing.T) map[string]string {
	t.Helper()
	var data []byte
	if !nettest.Eventually(60*time.Second, func() bool {
		var err error
		data, err = os.ReadFile(n.at("/run/flannel/subnet.env"))
		return err == nil && strings.Contains(string(data), "FLANNEL_SUBNET=")
	}) {
		t.Fatalf("%s: no subnet.env 60 s after flanneld's start:\n%s", n.name, n.log("flanneld"))
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	return env
}

// setFlannelNetwork writes the node's conflist as flannel's CNI plugin
// builds its delegate from subnet.env (bridge cni0, the node's subnet by
// host-local, hairpin mode, the default gateway on the bridge, the
// bridge's masquerade only where flanneld does none), then portmap with
// the portMappings capability and the given keys.
func (n *node) setFlannelNetwork(t *testing.T, env map[string]string, portmap map[string]any) {
	t.Helper()
	pm := map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}}
	for k, v := range portmap {
		pm[k] = v
	}
	var mtu int
	if _, err := fmt.Sscan(env["FLANNEL_MTU"], &mtu); err != nil {
		t.Fatalf("%s: FLANNEL_MTU %q: %v", n.name, env["FLANNEL_MTU"], err)
	}
	// the node's subnet, as its network (subnet.env has the bridge's
	// address in it)
	_, subnet, err := net.ParseCIDR(env["FLANNEL_SUBNET"])
	if err != nil {
		t.Fatalf("%s: FLANNEL_SUBNET: %v", n.name, err)
	}
	n.writeConflist(t, map[string]any{
		"cniVersion": n.rt.cniVersion,
		"name":       "kube",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "mtu": mtu,
				"isGateway": true, "isDefaultGateway": true, "hairpinMode": true,
				"ipMasq": env["FLANNEL_IPMASQ"] != "true",
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": subnet.String()}}},
					"routes": []map[string]string{{"dst": env["FLANNEL_NETWORK"]}},
				},
			},
			pm,
		},
	})
}

// startKubeProxy starts kube-proxy of the suite's release on the node in
// mode, its NodePorts on addr only, the pods' network cidr, leaving the
// machine's conntrack sizing alone.
func (n *node) startKubeProxy(t *testing.T, mode, addr, cidr string) {
	t.Helper()
	n.control = append(n.control, n.daemon(t, "kube-proxy", kubeBin("kube-proxy"),
		"--kubeconfig", n.kubeconfig, "--proxy-mode", mode, "--hostname-override", n.name,
		"--cluster-cidr", cidr, "--nodeport-addresses", addr+"/32",
		// the conntrack table's size and timeouts stay as the machine
		// has them (nf_conntrack_max and hashsize are the machine's)
		"--conntrack-max-per-core", "0", "--conntrack-min", "0",
		"--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256"))
}

// sandboxes are the network namespaces containerd made for the node's
// pods, as this process opens them.
func (n *node) sandboxes() []string {
	s, _ := filepath.Glob(n.at("/run/netns/cni-*"))
	return s
}

// mappings is `portmap-agent list --json` on the node.
func (n *node) mappings(t *testing.T) string {
	t.Helper()
	cmd := n.command(filepath.Join(nettest.BinDir(), "portmap-agent"), "list", "--json")
	cmd.Env = nettest.PluginEnv("", "", "", "")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: portmap-agent list: %v", n.name, err)
	}
	return strings.TrimSpace(string(out))
}
