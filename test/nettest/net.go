package nettest

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NewNS makes a network namespace that is removed when the test ends.
func NewNS(tb TB) ns.NetNS {
	tb.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		tb.Fatalf("new netns: %v", err)
	}
	if err := n.Do(func(ns.NetNS) error { return setupNS() }); err != nil {
		tb.Fatalf("set up netns: %v", err)
	}
	tb.Cleanup(func() { DeleteNS(n) })
	return n
}

// DeleteNS removes a namespace made by NewNS, as a runtime removes a
// container's: its file goes, so the path names nothing any more. Again
// is harmless.
func DeleteNS(n ns.NetNS) {
	n.Close()
	_ = testutils.UnmountNS(n)
}

// Client is a namespace wired to the host namespace by a veth pair, like a
// machine on the node's LAN.
type Client struct {
	NS     ns.NetNS
	HostIP []net.IP // the host's addresses on the link, IPv4 then IPv6
	IP     []net.IP // the client's addresses
}

// ClientNet is the address plan of a client link: IPv4 /24 and IPv6 /64
// prefixes, the host takes .1/::1 and the client .2/::2.
type ClientNet struct {
	HostIf string
	V4, V6 string // e.g. "198.51.100", "2001:db8:2:"
}

// NewClient makes the client namespace and its link.
func NewClient(tb TB, cn ClientNet) *Client {
	tb.Helper()
	c := &Client{NS: NewNS(tb)}
	peer := cn.HostIf + "p"
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: cn.HostIf}, PeerName: peer}
	if err := netlink.LinkAdd(veth); err != nil {
		tb.Fatalf("add veth %s: %v", cn.HostIf, err)
	}
	tb.Cleanup(func() { _ = netlink.LinkDel(veth) })
	p, err := netlink.LinkByName(peer)
	if err != nil {
		tb.Fatalf("find %s: %v", peer, err)
	}
	if err := netlink.LinkSetNsFd(p, int(c.NS.Fd())); err != nil {
		tb.Fatalf("move %s: %v", peer, err)
	}
	hostAddrs := []string{cn.V4 + ".1/24", cn.V6 + ":1/64"}
	clientAddrs := []string{cn.V4 + ".2/24", cn.V6 + ":2/64"}
	if err := Configure(cn.HostIf, hostAddrs, nil); err != nil {
		tb.Fatalf("host side: %v", err)
	}
	err = c.NS.Do(func(ns.NetNS) error {
		return Configure(peer, clientAddrs, []string{cn.V4 + ".1", cn.V6 + ":1"})
	})
	if err != nil {
		tb.Fatalf("client side: %v", err)
	}
	for i := range hostAddrs {
		hip, _, _ := net.ParseCIDR(hostAddrs[i])
		cip, _, _ := net.ParseCIDR(clientAddrs[i])
		c.HostIP = append(c.HostIP, hip)
		c.IP = append(c.IP, cip)
	}
	return c
}

// Configure brings link up with addrs (no duplicate address detection),
// and loopback, and default routes via gws.
func Configure(name string, addrs, gws []string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return err
		}
		addr.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", a, name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return err
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	for _, gw := range gws {
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: net.ParseIP(gw)}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("route via %s: %w", gw, err)
		}
	}
	return nil
}

// AddHostAddr adds another address to a host interface (for hostIP tests).
func AddHostAddr(tb TB, ifName, cidr string) {
	tb.Helper()
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		tb.Fatal(err)
	}
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		tb.Fatal(err)
	}
	addr.Flags = unix.IFA_F_NODAD
	if err := netlink.AddrAdd(link, addr); err != nil {
		tb.Fatalf("add %s: %v", cidr, err)
	}
}

// Server answers every TCP connection and UDP datagram on one port of a
// namespace with "<name> sees <peer address>".
type Server struct {
	Name string
	tcp  net.Listener
	udp  net.PacketConn
}

// Serve starts a server on port in n (all addresses, both families). It
// stops when the test ends.
func Serve(tb TB, n ns.NetNS, name string, port int) *Server {
	tb.Helper()
	s := &Server{Name: name}
	err := n.Do(func(ns.NetNS) error {
		var err error
		if s.tcp, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); err != nil {
			return err
		}
		s.udp, err = net.ListenPacket("udp", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		tb.Fatalf("serve %s:%d: %v", name, port, err)
	}
	tb.Cleanup(s.Close)
	go func() {
		for {
			c, err := s.tcp.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s sees %s\n", name, hostOf(c.RemoteAddr()))
			}()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := s.udp.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = s.udp.WriteTo([]byte(fmt.Sprintf("%s sees %s\n", name, hostOf(from))), from)
		}
	}()
	return s
}

// Close stops the server (as its container's end would).
func (s *Server) Close() {
	s.tcp.Close()
	s.udp.Close()
}

func hostOf(a net.Addr) string {
	h, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return h
}

// Timeout bounds every dial and read of the tests.
const Timeout = 2 * time.Second

// Dial sends one request over proto ("tcp" or "udp") to addr from namespace
// n (nil: the host namespace) and returns the reply line.
func Dial(n ns.NetNS, proto, addr string) (string, error) {
	var reply string
	do := func(ns.NetNS) error {
		c, err := net.DialTimeout(proto, addr, Timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(Timeout))
		if proto == "udp" {
			if _, err := c.Write([]byte("hi\n")); err != nil {
				return err
			}
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		reply = strings.TrimSpace(line)
		return err
	}
	var err error
	if n == nil {
		err = do(nil)
	} else {
		err = n.Do(do)
	}
	return reply, err
}

// Save returns the nat table of family 4 or 6 as iptables-save prints it,
// without comments and counters, for ruleset diffs.
func Save(tb TB, family int) string {
	tb.Helper()
	tool := "iptables-save"
	if family == 6 {
		tool = "ip6tables-save"
	}
	out, err := exec.Command(tool, "-t", "nat").CombinedOutput()
	if err != nil {
		tb.Fatalf("%s: %v\n%s", tool, err, out)
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, ":") {
			if i := strings.Index(l, " ["); i > 0 {
				l = l[:i]
			}
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

// IptablesRelease is the release of the iptables first on PATH ("1.8.9"),
// and whether it is iptables-nft.
func IptablesRelease(tb TB) (release string, nft bool) {
	tb.Helper()
	release, out := toolRelease(tb, "iptables") // "iptables v1.8.9 (nf_tables)"
	return release, strings.Contains(out, "nf_tables")
}

// NftRelease is the release of the nft first on PATH ("1.0.6").
func NftRelease(tb TB) string {
	tb.Helper()
	release, _ := toolRelease(tb, "nft") // "nftables v1.0.6 (Lester Gooch #5)"
	return release
}

// toolRelease runs tool --version and reads the release from its second
// word ("v1.8.9"); it returns the whole answer too.
func toolRelease(tb TB, tool string) (release, out string) {
	tb.Helper()
	b, err := exec.Command(tool, "--version").CombinedOutput()
	if err != nil {
		tb.Fatalf("%s --version: %v\n%s", tool, err, b)
	}
	f := strings.Fields(string(b))
	if len(f) < 2 || !strings.HasPrefix(f[1], "v") {
		tb.Fatalf("%s --version: %q", tool, b)
	}
	return strings.TrimPrefix(f[1], "v"), string(b)
}

// Run runs a command in the test's node namespace and fails the test on
// error. The tests use it to flush rulesets and set policies, so it
// refuses to run anywhere but in the namespace Main made.
func Run(tb TB, name string, args ...string) string {
	tb.Helper()
	if !Isolated() {
		tb.Fatalf("refusing to run %s %s outside the test's own network namespace", name, strings.Join(args, " "))
	}
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ResetNAT empties the nat tables of the isolated host namespace, for tests
// that need a fresh node. It refuses to run outside the namespace Main made.
//
// Three processes, whatever the node holds (a process is what a reset
// costs, most under an emulated guest): a restore of a nat table with
// its built-in chains alone, per family, which empties it and deletes its
// other chains as -F and -X would; and one nft batch that deletes our
// tables, each added first (adding a table that exists changes nothing),
// so that the batch never fails on an absent one.
func ResetNAT(tb TB) {
	tb.Helper()
	if !Isolated() {
		tb.Fatal("ResetNAT outside the isolated namespace")
	}
	const empty = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"
	for _, tool := range []string{"iptables-restore", "ip6tables-restore"} {
		RunInput(tb, empty, tool)
	}
	var script strings.Builder
	for _, fam := range []string{"ip", "ip6"} {
		for _, table := range []string{"cni_portmap", "cni_hostport"} {
			fmt.Fprintf(&script, "add table %[1]s %[2]s\ndelete table %[1]s %[2]s\n", fam, table)
		}
	}
	RunInput(tb, script.String(), "nft", "-f", "-")
}

// RunInput is Run with input on the command's standard input.
func RunInput(tb TB, input, name string, args ...string) string {
	tb.Helper()
	if !Isolated() {
		tb.Fatalf("refusing to run %s %s outside the test's own network namespace", name, strings.Join(args, " "))
	}
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v\n%s\ninput:\n%s", name, strings.Join(args, " "), err, out, input)
	}
	return string(out)
}
