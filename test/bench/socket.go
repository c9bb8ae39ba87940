package main

import (
	"fmt"
	"net"
	"strings"

	"github.com/portmap-dev/portmap/test/nettest"
)

// The socket path (issue #16, "localhost": "socket"), ours only: upstream
// has none. Its programs attach to a child cgroup of a privately mounted
// cgroup2 and pin in a bpffs of this run (nettest.CgroupSite); the clients
// run in that cgroup, in the node namespace.

// socketRate is one family's localhost connection rate: through the
// socket path, directly to the container, and through the NAT path
// (route_localnet and the localhost DNAT; IPv4 only: IPv6 has none).
type socketRate struct {
	Backend string  `json:"backend"`
	Family  int     `json:"family"`
	Socket  float64 `json:"socket_per_s"`
	Direct  float64 `json:"direct_per_s"`
	NAT     float64 `json:"nat_per_s,omitempty"`
}

// socketAdd is ADD of one container with a TCP mapping, "localhost":
// "nat" against "socket", in one run.
type socketAdd struct {
	Backend   string  `json:"backend"`
	First     float64 `json:"first_install_ms"`
	NATP50    float64 `json:"nat_p50_ms"`
	SocketP50 float64 `json:"socket_p50_ms"`
	NATRSS    int64   `json:"nat_max_rss_kb"`
	SocketRSS int64   `json:"socket_max_rss_kb"`
	NATProcs  int     `json:"nat_processes"`
	SockProcs int     `json:"socket_processes"`
}

// socketRounds alternate the connection runs, so that a slow moment of
// the machine does not land on one path only; each row keeps its median.
const socketRounds = 3

func localhostConf(backend, mode string, site *nettest.CgroupSite) []byte {
	c := nettest.PortmapConf("bench", backend, []nettest.Mapping{{HostPort: probePort, ContainerPort: 80, Protocol: "tcp"}}, probeIP+"/16")
	c["localhost"] = mode
	c["cgroupPath"], c["bpfPinDir"] = site.Cgroup, site.PinDir
	return marshal(c)
}

// measureSocketAdd times ADD (then DEL, untimed) of the probe container
// with "localhost": "nat" and "socket", interleaved; the first socket ADD,
// which loads and attaches the programs, is reported on its own.
func measureSocketAdd(backend string, samples int) socketAdd {
	tb := newTB()
	defer tb.cleanup()
	nettest.ResetNAT(tb)
	site := nettest.NewCgroupSite(tb)
	bin := binary("ours")
	confs := map[string][]byte{"nat": localhostConf(backend, "nat", site), "socket": localhostConf(backend, "socket", site)}
	out := socketAdd{Backend: backend}
	d, err := invoke(bin, "ADD", "probe", confs["socket"])
	if err != nil {
		fatalf("first socket ADD: %v", err)
	}
	out.First = ms(d)
	if _, err := invoke(bin, "DEL", "probe", confs["socket"]); err != nil {
		fatalf("%v", err)
	}
	times := map[string][]float64{}
	for range samples {
		for _, mode := range []string{"nat", "socket"} {
			d, err := invoke(bin, "ADD", "probe", confs[mode])
			if err != nil {
				fatalf("%v", err)
			}
			times[mode] = append(times[mode], ms(d))
			if _, err := invoke(bin, "DEL", "probe", confs[mode]); err != nil {
				fatalf("%v", err)
			}
		}
	}
	for _, mode := range []string{"nat", "socket"} {
		use, err := peakRSS(bin, "ADD", "probe", confs[mode])
		if err != nil {
			fatalf("%v", err)
		}
		if mode == "nat" {
			out.NATRSS = use.Peak
		} else {
			out.SocketRSS = use.Peak
		}
		if _, err := invoke(bin, "DEL", "probe", confs[mode]); err != nil {
			fatalf("%v", err)
		}
	}
	out.NATP50, out.SocketP50 = percentile(times["nat"], 50), percentile(times["socket"], 50)
	out.NATProcs = countProcs(bin, "ADD", confs["nat"])
	out.SockProcs = countProcs(bin, "ADD", confs["socket"])
	return out
}

// measureSocketConns wires two real containers through libcni (ptp and
// host-local, dual stack): one on a network with "localhost": "socket"
// (host port 8080), one with the NAT path (host port 8081). A client in
// the test cgroup, in the node namespace, opens new TCP connections to
// 127.0.0.1 and [::1] through the socket path, to the container's own
// addresses, and to 127.0.0.1 through the NAT path.
func measureSocketConns(backend string, count int) []socketRate {
	tb := newTB()
	defer tb.cleanup()
	nettest.ResetNAT(tb)
	site := nettest.NewCgroupSite(tb)
	be := fmt.Sprintf("%q", backend)
	sock := nettest.NewRuntime(tb, nettest.Net{Name: "benchsock", V4: "192.0.2.0/24", V6: "2001:db8:5::/64",
		Extra: map[string]string{"backend": be, "localhost": `"socket"`,
			"cgroupPath": fmt.Sprintf("%q", site.Cgroup), "bpfPinDir": fmt.Sprintf("%q", site.PinDir)}})
	natNet := nettest.NewRuntime(tb, nettest.Net{Name: "benchnat", V4: "192.0.3.0/24", Extra: map[string]string{"backend": be}})
	c := sock.MustAdd(tb, "sock", nettest.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	n := natNet.MustAdd(tb, "nat", nettest.Mapping{HostPort: 8081, ContainerPort: 80, Protocol: "tcp"})
	nettest.Serve(tb, c.NS, "sock", 80)
	nettest.Serve(tb, n.NS, "nat", 80)
	tb.Cleanup(func() {
		for _, x := range []struct {
			rt *nettest.Runtime
			c  *nettest.Container
		}{{sock, c}, {natNet, n}} {
			if err := x.rt.Del(x.c); err != nil {
				tb.Errorf("DEL %s: %v", x.c.ID, err)
			}
		}
	})
	runs := []struct {
		family int
		path   string
		addr   string
	}{
		{4, "socket", "127.0.0.1:8080"},
		{4, "direct", net.JoinHostPort(c.IP(4), "80")},
		{4, "nat", "127.0.0.1:8081"},
		{6, "socket", "[::1]:8080"},
		{6, "direct", net.JoinHostPort(c.IP(6), "80")},
	}
	got := map[string][]float64{}
	for range socketRounds {
		for _, r := range runs {
			rate, err := site.Rate(r.addr, count, connLimit)
			if err != nil {
				fatalf("%s %s: %v", backend, r.path, err)
			}
			key := fmt.Sprint(r.family, r.path)
			got[key] = append(got[key], rate)
		}
	}
	med := func(family int, path string) float64 { return percentile(got[fmt.Sprint(family, path)], 50) }
	return []socketRate{
		{Backend: backend, Family: 4, Socket: med(4, "socket"), Direct: med(4, "direct"), NAT: med(4, "nat")},
		{Backend: backend, Family: 6, Socket: med(6, "socket"), Direct: med(6, "direct")},
	}
}

var socketRateHead = []string{"backend", "family", "socket path /s", "direct /s", "NAT path /s", "socket ÷ direct", "socket ÷ NAT"}

func (r *report) socketRateRows() [][]string {
	var rows [][]string
	for _, s := range r.SocketRates {
		nat, vsNAT := "- (none for IPv6)", "-"
		if s.NAT > 0 {
			nat, vsNAT = fmt.Sprintf("%.0f", s.NAT), fmt.Sprintf("%.2f", s.Socket/s.NAT)
		}
		rows = append(rows, []string{s.Backend, fmt.Sprintf("IPv%d", s.Family), fmt.Sprintf("%.0f", s.Socket),
			fmt.Sprintf("%.0f", s.Direct), nat, fmt.Sprintf("%.2f", s.Socket/s.Direct), vsNAT})
	}
	return rows
}

var socketAddHead = []string{"backend", "ADD nat p50 ms", "ADD socket p50 ms", "socket ÷ nat", "first socket ADD (installs) ms", "max RSS nat / socket MiB", "processes nat / socket"}

func (r *report) socketAddRows() [][]string {
	var rows [][]string
	for _, a := range r.SocketAdds {
		rows = append(rows, []string{a.Backend, fmt.Sprintf("%.1f", a.NATP50), fmt.Sprintf("%.1f", a.SocketP50),
			fmt.Sprintf("%.2f", a.SocketP50/a.NATP50), fmt.Sprintf("%.1f", a.First),
			fmt.Sprintf("%.1f / %.1f", float64(a.NATRSS)/1024, float64(a.SocketRSS)/1024), fmt.Sprintf("%d / %d", a.NATProcs, a.SockProcs)})
	}
	return rows
}

// socketGoals are issue #16's goals.
func (r *report) socketGoals(add func(goal, measured string, met bool)) {
	for _, s := range r.SocketRates {
		ratio := s.Socket / s.Direct
		add(fmt.Sprintf("%s IPv%d localhost connections/s: socket path ≥ 0.95× direct", s.Backend, s.Family), fmt.Sprintf("%.2f×", ratio), ratio >= 0.95)
		if s.NAT > 0 {
			ratio := s.Socket / s.NAT
			add(fmt.Sprintf("%s IPv%d localhost connections/s: socket path ≥ 1.2× NAT path", s.Backend, s.Family), fmt.Sprintf("%.2f×", ratio), ratio >= 1.2)
		}
	}
	for _, a := range r.SocketAdds {
		ratio := a.SocketP50 / a.NATP50
		add(fmt.Sprintf("%s ADD with \"socket\": p50 ≤ 1.2× ADD with \"nat\"", a.Backend), fmt.Sprintf("%.2f×", ratio), ratio <= 1.2)
		extra := float64(a.SocketRSS-a.NATRSS) / 1024
		add(fmt.Sprintf("%s ADD with \"socket\": plugin memory ≤ \"nat\" + 2 MiB", a.Backend), fmt.Sprintf("%+.1f MiB", extra), extra <= 2)
		add(fmt.Sprintf("%s ADD with \"socket\": no process more than \"nat\"", a.Backend), fmt.Sprintf("%d / %d", a.NATProcs, a.SockProcs), a.SockProcs <= a.NATProcs)
	}
}

func socketText(r *report) string {
	if len(r.SocketRates)+len(r.SocketAdds) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nThe socket path (\"localhost\": \"socket\", ours only): new TCP connections per second from a node process\n")
	b.WriteString(textTable(socketRateHead, r.socketRateRows()))
	b.WriteString("\nADD of one container (a TCP mapping) with \"localhost\": \"nat\" and \"socket\"\n")
	b.WriteString(textTable(socketAddHead, r.socketAddRows()))
	return b.String()
}

func socketMarkdown(r *report) string {
	if len(r.SocketRates)+len(r.SocketAdds) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n### The socket path (\"localhost\": \"socket\", ours only)\n\n")
	b.WriteString("New TCP connections per second (connect, read a line, close) from a process on the node, in the cgroup the programs are attached to: to `127.0.0.1` and `[::1]` through the socket path, to the container's own address, and to `127.0.0.1` through the NAT path (`route_localnet` and the localhost DNAT; IPv6 has none). Median of 3 alternating runs.\n\n")
	b.WriteString(mdTable(socketRateHead, r.socketRateRows()))
	b.WriteString("\nADD of one container with a TCP mapping, \"nat\" and \"socket\" interleaved; the first socket ADD loads and attaches the programs.\n\n")
	b.WriteString(mdTable(socketAddHead, r.socketAddRows()))
	return b.String()
}
