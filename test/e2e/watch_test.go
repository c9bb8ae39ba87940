package e2e

import (
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/nfevents"
	"github.com/portmap-dev/portmap/test/nettest"
)

// watcher is a running `portmap-agent sync --watch` and its log.
type watcher = nettest.Watcher

func startWatch(t *testing.T, args ...string) *watcher {
	t.Helper()
	return startWatchOf(t, "portmap-agent", nil, "watching", args...)
}

// startWatchOf runs `bin sync --watch args` (portmap or portmap-agent)
// with env added to the environment, and waits for it to log started.
func startWatchOf(t *testing.T, bin string, env []string, started string, args ...string) *watcher {
	t.Helper()
	return nettest.StartWatch(t, bin, env, started, args...)
}

// TestWatchRepairsWithinTwoSeconds: with `portmap-agent sync --watch` running,
// host ports work again within 2 s of a flush of the firewall; with
// nothing changing it writes nothing (no nf_tables event in 3 s, while it
// passes every second); SIGTERM ends it cleanly.
func TestWatchRepairsWithinTwoSeconds(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := client(t)
		cache := t.TempDir()
		rt := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "watch", V4: "192.0.2.0/28", Extra: extra}, cache)
		c := rt.MustAdd(t, "w1", nettest.Mapping{HostPort: 6401, ContainerPort: srvPort},
			nettest.Mapping{HostPort: 6453, ContainerPort: srvPort, Protocol: "udp"})
		nettest.Serve(t, c.NS, "w1", srvPort)
		expectReply(t, cl, "tcp", addr(nodeIP, 6401), "w1", clientIP)

		w := startWatch(t, "--cache-dir", cache, "--interval", "1s")

		// Idle: passes every second, none writes.
		sub, err := nfevents.Subscribe()
		if err != nil {
			t.Fatal(err)
		}
		before := w.Lines()
		select {
		case <-sub.C:
			t.Errorf("an idle watcher changed the firewall; log:\n%s", w.Text())
		case <-time.After(3 * time.Second):
		}
		sub.Close()
		if w.Lines() != before {
			t.Errorf("an idle watcher logged:\n%s", w.Text())
		}

		for round := range 2 {
			b.flushFirewall(t)
			start := time.Now()
			var got string
			for time.Since(start) < 2*time.Second {
				if got, err = nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6401)); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil || got != "w1 sees "+clientIP {
				t.Fatalf("round %d: host port not back 2 s after the flush: %q, %v", round, got, err)
			}
			t.Logf("round %d: host port back %s after the flush", round, time.Since(start).Round(time.Millisecond))
			expectReply(t, cl, "udp", addr(nodeIP, 6453), "w1", clientIP)
		}
		w.WaitFor(t, `msg="attachment repaired" network=watch container=w1 ifname=eth0`, time.Second)
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK after the watcher's repair: %v", err)
		}

		w.Terminate(t)
		w.WaitFor(t, "msg=stopping", time.Second)
	})
}
