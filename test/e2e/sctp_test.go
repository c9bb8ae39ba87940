package e2e

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/test/nettest"
)

// TestSCTPAssociationSurvivesRepair: a client holds an SCTP association
// to a host port and the container sends on it every 100 ms. The
// forwarding is flushed under it (the association's conntrack entry
// keeps translating), then `portmap-agent sync` repairs the rules: the
// association keeps delivering, because the repair flushes only entries
// the rules now translate otherwise, and conntrack could not pick an SCTP
// association up again mid-stream. The host's kernel here has no SCTP;
// Debian's kernels do, and the guests run this test (make guest-test).
func TestSCTPAssociationSurvivesRepair(t *testing.T) {
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP); err == nil {
		unix.Close(fd)
	} else if os.Getenv("PORTMAP_GUEST") == "" {
		t.Skipf("this kernel has no SCTP (%v); make guest-test runs the test in Debian's kernels", err)
	} else {
		t.Fatalf("Debian's kernel without SCTP: %v", err)
	}
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := client(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "sctp", V4: "192.0.2.0/28", Extra: extra})
		c := rt.MustAdd(t, "s1", nettest.Mapping{HostPort: 9132, ContainerPort: 9132, Protocol: "sctp"})
		srv := sctpSocket(t, c.NS, func(fd int) error {
			if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 9132}); err != nil {
				return err
			}
			return unix.Listen(fd, 1)
		})
		go func() {
			fd, _, err := unix.Accept(srv)
			if err != nil {
				return
			}
			defer unix.Close(fd)
			for {
				if _, err := unix.Write(fd, []byte("push\n")); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		to := netip.MustParseAddr(nodeIP).As4()
		conn := sctpSocket(t, cl.NS, func(fd int) error {
			return unix.Connect(fd, &unix.SockaddrInet4{Addr: to, Port: 9132})
		})
		pushes := func(d time.Duration) int {
			n := 0
			buf := make([]byte, 64)
			_ = unix.SetsockoptTimeval(conn, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000})
			for end := time.Now().Add(d); time.Now().Before(end); {
				if k, err := unix.Read(conn, buf); err == nil && k > 0 {
					n += strings.Count(string(buf[:k]), "push")
				}
			}
			return n
		}
		if n := pushes(time.Second); n < 5 {
			t.Fatalf("the association before the flush: %d pushes in 1 s, want about 10", n)
		}
		if b.name == "nftables" {
			nettest.Run(t, "nft", "flush", "table", "ip", "cni_portmap")
		} else {
			nettest.Run(t, "iptables", "-t", "nat", "-F", "CNI-HOSTPORT-DNAT")
		}
		if n := pushes(time.Second); n < 5 {
			t.Fatalf("after the flush, before the repair: %d pushes in 1 s, want about 10 (the entry translates them)", n)
		}
		if r, status := runSync(t, "--cache-dir", rt.CacheDir); status != 0 || states(r)["sctp/s1"] != "repaired" {
			t.Fatalf("sync after the flush: exit %d, %v; want s1 repaired", status, states(r))
		}
		pushes(300 * time.Millisecond) // those sent before the repair, queued
		n := pushes(2 * time.Second)
		t.Logf("%s: %d pushes in the 2 s after the repair", b.name, n)
		if n < 10 {
			t.Errorf("%d pushes in the 2 s after the repair, want about 20: the repair's flush broke an association that was right", n)
		}
	})
}

// sctpSocket is a one-to-one SCTP socket made in netns n and readied
// there by ready; closed when the test ends.
func sctpSocket(t *testing.T, n ns.NetNS, ready func(fd int) error) int {
	t.Helper()
	fd := -1
	err := n.Do(func(ns.NetNS) error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP); err != nil {
			return err
		}
		return ready(fd)
	})
	if fd >= 0 {
		t.Cleanup(func() { unix.Close(fd) })
	}
	if err != nil {
		t.Fatal(errors.Join(errors.New("sctp socket"), err))
	}
	return fd
}
