package nodesafety

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/test/nettest"
)

// pass is the part of `portmap-agent sync --json` this test reads.
type pass struct {
	Shared  []struct{ What string }
	Orphans []struct{ ContainerID, State string }
	Summary struct{ OK, Repaired, Errors, Orphans, Pruned int }
}

func syncPass(t *testing.T, node *nettest.Node, args ...string) pass {
	t.Helper()
	out, stderr, status, err := podAgent(t, node, append([]string{"sync", "--json"}, args...)...)
	var p pass
	if err != nil || status != 0 || json.Unmarshal([]byte(out), &p) != nil {
		t.Fatalf("portmap-agent sync %s: exit %d, %v\n%s%s", strings.Join(args, " "), status, err, out, stderr)
	}
	return p
}

// killedAfter starts `portmap-agent sync args...` as the DaemonSet runs
// it and kills it (SIGKILL) after delay; it reports whether the pass was
// still running, and its pid (the pod's setup execs the agent: one
// process).
func killedAfter(t *testing.T, node *nettest.Node, delay time.Duration, args ...string) (bool, int) {
	t.Helper()
	cmd, started, err := node.AgentPodCommand(daemonSetCaps(t), append([]string{"sync"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Start()
	started()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return false, cmd.Process.Pid
	case <-time.After(delay):
		_ = cmd.Process.Kill()
		<-done
		return true, cmd.Process.Pid
	}
}

// TestAgentKilledMidPass: `portmap-agent sync --prune`, run as the
// DaemonSet runs it and killed (SIGKILL)
// at a random moment of a pass that repairs twelve attachments after a
// firewall flush and prunes an orphan (a container of upstream's plugin
// that the cache does not name), ten times per backend. After each kill
// the host lock is free at once, and the next pass, run whole, leaves the
// node as it should be: every cached container CHECKs and its host port
// answers, the orphan is gone, and a pass after it finds nothing to do.
func TestAgentKilledMidPass(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := lan(t)
		node := nettest.NewNode(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "kill", V4: "192.0.2.96/27", Extra: extra})
		up := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "kill", V4: "192.0.2.128/27", Portmap: "portmap-upstream", NoMasq: true}, t.TempDir())
		var live []*nettest.Container
		for i := range 12 {
			c := rt.MustAdd(t, fmt.Sprintf("k%d", i), nettest.Mapping{HostPort: 6400 + i, ContainerPort: srvPort})
			nettest.Serve(t, c.NS, c.ID, srvPort)
			live = append(live, c)
		}
		flush := func() {
			if backend == "nftables" {
				nettest.Run(t, "nft", "flush", "table", "ip", "cni_portmap")
			} else {
				nettest.Run(t, "iptables", "-t", "nat", "-F")
			}
		}
		args := []string{"--prune", "--cache-dir", rt.CacheDir}
		// the shortest of three whole passes: the first, with cold
		// caches, can take ten times the others, and kills timed by it
		// would land after most passes ended
		var whole time.Duration
		for i := range 3 {
			flush()
			start := time.Now()
			syncPass(t, node, args...)
			if took := time.Since(start); i == 0 || took < whole {
				whole = took
			}
		}
		t.Logf("a whole pass repairing 12 attachments: %s", whole.Round(time.Millisecond))

		killed, before := 0, 0
		const trials = 10
		for trial := range trials {
			orphan := up.MustAdd(t, fmt.Sprintf("orphan%d", trial), nettest.Mapping{HostPort: 6500 + trial, ContainerPort: srvPort, Protocol: "tcp"})
			nettest.Serve(t, orphan.NS, orphan.ID, srvPort)
			if got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6500+trial)); err != nil || !strings.HasPrefix(got, orphan.ID+" sees ") {
				t.Fatalf("trial %d: the orphan's host port before the passes: %q, %v", trial, got, err)
			}
			flush()
			delay := time.Duration(rand.Int64N(int64(whole)))
			was, pid := killedAfter(t, node, delay, args...)
			if was {
				killed++
			} else {
				// the pass was shorter than the window: the whole passes
				// were measured slow (go test runs other suites beside
				// this one), so the window shrinks toward the passes
				whole = max(whole*2/3, time.Millisecond)
			}
			// the lock goes with the process (another suite's plugin
			// may hold it meanwhile: the file is the machine's) — and
			// with a child it was starting, which holds the file until
			// its exec closes it: a moment, not a wait
			mine := func() string {
				if held := lock.HeldBy(lock.DefaultPath); strings.Contains(held, fmt.Sprintf(" pid %d ", pid)) {
					return held
				}
				return ""
			}
			if held := mine(); held != "" {
				if !nettest.Eventually(time.Second, func() bool { return mine() == "" }) {
					t.Errorf("trial %d (killed after %s): the killed pass still holds the host lock a second on%s", trial, delay, held)
				}
				t.Logf("trial %d: the killed pass's lock outlived it a moment (a child before its exec)%s", trial, held)
			}
			release, err := lock.Acquire(lock.DefaultPath, 5*time.Second)
			if err != nil {
				t.Fatalf("trial %d (killed after %s): the host lock: %v", trial, delay, err)
			}
			release()
			p := syncPass(t, node, args...)
			if p.Summary.Errors != 0 {
				t.Fatalf("trial %d (killed after %s): the next pass: %+v", trial, delay, p)
			}
			if p.Summary.Repaired > 0 {
				before++ // killed before its write
			}
			for _, c := range live {
				if err := rt.Check(c); err != nil {
					t.Fatalf("trial %d (killed after %s): CHECK %s after the next pass: %v", trial, delay, c.ID, err)
				}
			}
			port := 6400 + trial
			if got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, port)); err != nil || !strings.HasPrefix(got, fmt.Sprintf("k%d sees ", trial)) {
				t.Errorf("trial %d: host port %d: %q, %v", trial, port, got, err)
			}
			if save := nettest.Save(t, 4); strings.Contains(save, fmt.Sprintf("--dport %d ", 6500+trial)) {
				t.Errorf("trial %d (killed after %s): the orphan's rules are still there after the next pass %+v", trial, delay, p)
			}
			if got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6500+trial)); err == nil {
				t.Errorf("trial %d: the orphan's host port still answers %q", trial, got)
			}
			if p := syncPass(t, node, args...); p.Summary.Repaired+p.Summary.Orphans+len(p.Shared) != 0 {
				t.Errorf("trial %d: the pass after the next: %+v, want nothing to do", trial, p)
			}
		}
		t.Logf("%d trials, %d passes killed before they finished, %d of them before they wrote", trials, killed, before)
		if killed < trials/2 {
			t.Errorf("only %d of %d passes were killed midway: the delays miss the pass", killed, trials)
		}
	})
}
