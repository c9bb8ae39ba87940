package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/portmap-dev/portmap/test/nettest"
)

// connLimit bounds each connection-rate run.
const connLimit = 10 * time.Second

// measureConns wires a real container (ptp + host-local + the plugin under
// test) with a server, maps host port 8080 to it with n other containers
// mapped, and measures new TCP connections per second from a client
// namespace through the host port and directly to the container.
func measureConns(plugin, backend string, n, count int) connRate {
	tb := newTB()
	defer tb.cleanup()
	nettest.ResetNAT(tb)
	fill(binary(plugin), backend, n)
	cl := nettest.NewClient(tb, nettest.ClientNet{HostIf: "bcl0", V4: "198.51.100", V6: "2001:db8:2:"})
	typ := "portmap"
	if plugin == "upstream" {
		typ = "portmap-upstream"
	}
	rt := nettest.NewRuntime(tb, nettest.Net{Name: "benchconn", V4: "192.0.2.0/24", Portmap: typ,
		Extra: map[string]string{"backend": fmt.Sprintf("%q", backend)}})
	c := rt.MustAdd(tb, "conn", nettest.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	nettest.Serve(tb, c.NS, "srv", 80)
	// The two runs dial from different client addresses: a reused
	// ephemeral port must not meet the other run's conntrack entry, whose
	// reply tuple (container:80 -> client:port) would be the new SYN's.
	if err := cl.NS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("bcl0p")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr("198.51.100.3/24")
		return netlink.AddrAdd(link, a)
	}); err != nil {
		fatalf("second client address: %v", err)
	}
	// The two are measured in rounds, one run of each, the one that goes
	// first alternating, and a round's ratio compares its two runs: one
	// run of each, one after the other, compared whatever the machine did
	// in between (their ratio moved 0.66–1.32 between full runs of the
	// same code), and a round's runs vary by a quarter from round to
	// round on this bench's machines.
	var hostPort, direct, ratios []float64
	viaHostPort := func() float64 { return rate(cl.NS, "198.51.100.2", "198.51.100.1:8080", count/connRounds) }
	viaDirect := func() float64 { return rate(cl.NS, "198.51.100.3", net.JoinHostPort(c.IP(4), "80"), count/connRounds) }
	for i := range connRounds {
		var h, d float64
		if i%2 == 0 {
			h, d = viaHostPort(), viaDirect()
		} else {
			d, h = viaDirect(), viaHostPort()
		}
		hostPort, direct, ratios = append(hostPort, h), append(direct, d), append(ratios, h/d)
	}
	return connRate{Plugin: plugin, Backend: backend, N: n,
		HostPort: percentile(hostPort, 50), Direct: percentile(direct, 50), Ratio: percentile(ratios, 50)}
}

// connRounds is how many rounds a connection-rate run of count
// connections a side is cut into.
const connRounds = 10

// rate opens up to count connections one after another from namespace n
// (each: connect, read the server's line, close) and returns completed
// connections per second. It stops at connLimit.
func rate(n ns.NetNS, from, addr string, count int) float64 {
	var done int
	var elapsed time.Duration
	err := n.Do(func(ns.NetNS) error {
		start := time.Now()
		buf := make([]byte, 128)
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		for done < count && time.Since(start) < connLimit {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return err
			}
			_ = c.SetDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(buf); err != nil && err != io.EOF {
				c.Close()
				return err
			}
			c.Close()
			done++
		}
		elapsed = time.Since(start)
		return nil
	})
	if err != nil {
		fatalf("connections to %s: %v", addr, err)
	}
	return float64(done) / elapsed.Seconds()
}

// benchTB gives the test harness what it needs outside of go test.
type benchTB struct {
	cleanups []func()
}

// failed is set by Errorf of any benchTB.
var failed bool

func newTB() *benchTB { return &benchTB{} }

func (*benchTB) Helper()                           {}
func (*benchTB) Fatal(args ...any)                 { fatalf("%s", fmt.Sprint(args...)) }
func (*benchTB) Fatalf(format string, args ...any) { fatalf(format, args...) }
func (t *benchTB) Cleanup(f func())                { t.cleanups = append(t.cleanups, f) }

// Errorf reports a failure that does not stop the run (a cleanup that
// could not finish); the benchmark exits non-zero at its end.
func (t *benchTB) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	failed = true
}

func (t *benchTB) TempDir() string {
	dir, err := os.MkdirTemp("", "bench-")
	if err != nil {
		fatalf("%v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// cleanup runs the cleanups, last first, as testing does.
func (t *benchTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	t.cleanups = nil
}
