package e2e

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

var churnCycles = flag.Int("churn.cycles", 40, "ADD/DEL cycles of each TestAgentChurn case")

// churnCase is one way the agent runs beside a busy runtime.
type churnCase struct {
	name string
	// args are the agent's flags beyond --cache-dir and --interval.
	args []string
	// socket turns on "localhost": "socket" (the socket path's entries
	// must follow the rules' fate).
	socket bool
	// restart kills the agent (SIGKILL) halfway and starts another.
	restart bool
	// leftover puts one deleted container's cache entry back after its
	// DEL, as a runtime that crashed before removing it leaves it.
	leftover bool
	// agent runs portmap-agent with its metrics, as the DaemonSet does,
	// instead of portmap-agent sync --watch.
	agent bool
	// forwardAccept turns the layer on: its FORWARD accepts must follow
	// the rules' fate.
	forwardAccept bool
}

// TestAgentChurn: containers are ADDed and DELeted through libcni (ptp,
// host-local, portmap; the cache in a directory of the test's own, as
// runtimes do) while the agent watches the same cache and passes every
// 300 ms; three containers are alive at a time, each with a host port of
// its own, and their addresses come from a /28, so host-local hands a
// deleted container's address to a later one. At random points and at
// the end, the node's host-port table (`portmap-agent list`) equals the model
// — the containers alive, nothing of a deleted one — and at the end every
// deleted container's host port is refused, every live one answers and
// passes CHECK. Cases: the agent's default flags; --prune with the agent
// killed and restarted halfway and a cache entry left behind after DEL;
// the socket path with --prune.
func TestAgentChurn(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		for _, tc := range []churnCase{
			{name: "default", leftover: true, agent: true},
			// --min-sync-period 0: a pass as soon as events settle, the
			// most passes to land between a cache read and a DEL.
			{name: "prune", args: []string{"--prune", "--min-sync-period", "0"}, restart: true, leftover: true},
			{name: "socket", args: []string{"--prune", "--min-sync-period", "0"}, socket: true},
			{name: "forwardAccept", args: []string{"--prune", "--min-sync-period", "0"}, forwardAccept: true},
		} {
			t.Run(tc.name, func(t *testing.T) { churn(t, b, maps.Clone(extra), tc) })
		}
	})
}

// churned is one container of the churn and what the test knows of it.
type churned struct {
	c    *nettest.Container
	srv  *nettest.Server
	port int
	ip   string // its address while it was alive
}

func churn(t *testing.T, b backend, extra map[string]string, tc churnCase) {
	nettest.ResetNAT(t)
	cl := client(t)
	cache := t.TempDir()
	var site *nettest.CgroupSite
	var listArgs []string
	if tc.socket {
		site = nettest.NewCgroupSite(t)
		extra = socketExtra(extra, "socket", site)
		listArgs = []string{"--bpf-pin-dir", site.PinDir}
	}
	if tc.forwardAccept {
		extra["forwardAccept"] = "true"
	}
	rt := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "churn", V4: "192.0.2.0/28", Extra: extra}, cache)
	check := func(alive []*churned, when string) {
		t.Helper()
		expectTable(t, b, listArgs, alive, when)
		if tc.forwardAccept {
			expectAccepts(t, alive, when)
		}
	}
	seed := rand.Uint64()
	rnd := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)

	args := append([]string{"--cache-dir", cache, "--interval", "300ms"}, tc.args...)
	start := func() *watcher { return startWatch(t, args...) }
	if tc.agent {
		args = append(args, "--metrics-addr", "127.0.0.1:0")
		start = func() *watcher { return startWatchOf(t, "portmap-agent", nil, "serving /metrics", args...) }
	}
	w := start()

	var alive, deleted []*churned
	t.Cleanup(func() {
		for _, k := range alive {
			_ = rt.Del(k.c)
		}
	})
	leftoverAt := *churnCycles / 3
	var leftover *churned
	for i := 1; i <= *churnCycles; i++ {
		id := fmt.Sprintf("c%d", i)
		port := 20000 + i
		c, err := rt.Add(t, id, nettest.Mapping{HostPort: port, ContainerPort: srvPort})
		if err != nil {
			t.Fatalf("cycle %d: ADD %s: %v\nagent log:\n%s", i, id, err, w.Text())
		}
		alive = append(alive, &churned{c: c, srv: nettest.Serve(t, c.NS, id, srvPort), port: port, ip: c.IP(4)})
		if len(alive) > 3 {
			k := alive[0]
			alive = alive[1:]
			entry := cacheEntry(cache, "churn", k.c.ID)
			saved, _ := os.ReadFile(entry)
			if err := rt.Del(k.c); err != nil {
				t.Fatalf("cycle %d: DEL %s: %v", i, k.c.ID, err)
			}
			if tc.leftover && leftover == nil && i >= leftoverAt {
				// The runtime crashed after DEL: its entry stays.
				if err := os.WriteFile(entry, saved, 0o600); err != nil {
					t.Fatal(err)
				}
				leftover = k
			}
			k.srv.Close()
			nettest.DeleteNS(k.c.NS)
			deleted = append(deleted, k)
		}
		if tc.restart && i == *churnCycles/2 {
			w.Kill()
			t.Logf("cycle %d: agent killed (SIGKILL) and started again", i)
			w = start()
		}
		if rnd.IntN(5) == 0 {
			// a pass may be under way: give the agent a moment to do wrong
			time.Sleep(time.Duration(rnd.IntN(400)) * time.Millisecond)
			check(alive, fmt.Sprintf("cycle %d", i))
		}
	}

	// Two intervals and more: whatever the agent would do, it has done.
	time.Sleep(time.Second)
	settled := w.Lines()
	check(alive, "after the churn")
	for _, k := range deleted {
		expectNoReply(t, cl, "tcp", addr(nodeIP, k.port))
		if site != nil {
			expectSocketRefused(t, site, "tcp", fmt.Sprintf("127.0.0.1:%d", k.port))
		}
	}
	for _, k := range alive {
		expectReply(t, cl, "tcp", addr(nodeIP, k.port), k.c.ID, clientIP)
		if site != nil {
			expectSocket(t, site, "tcp", fmt.Sprintf("127.0.0.1:%d", k.port), k.c.ID)
		}
		if err := rt.Check(k.c); err != nil {
			t.Errorf("CHECK of live %s: %v", k.c.ID, err)
		}
	}
	if leftover != nil {
		w.WaitFor(t, fmt.Sprintf(`msg="attachment withheld" network=churn container=%s ifname=eth0 reason=deleted`, leftover.c.ID), time.Second)
		time.Sleep(time.Second)
		if strings.Contains(w.Since(settled), "container="+leftover.c.ID+" ") {
			t.Errorf("the entry left behind is logged again and again (passes every 300 ms):\n%s", w.Text())
		}
	}
	if tc.agent {
		m := regexp.MustCompile(`addr=(127\.0\.0\.1:\d+)`).FindStringSubmatch(w.Text())
		if m == nil {
			t.Fatalf("no metrics address in the log:\n%s", w.Text())
		}
		a := agentProbe{t, "http://" + m[1]}
		if n := a.metric("portmap_agent_withheld_total", `reason="deleted"`); n < 1 {
			t.Errorf("portmap_agent_withheld_total{reason=\"deleted\"} = %v, want the entry left behind counted", n)
		}
	}
	if strings.Contains(w.Text(), "level=ERROR") {
		t.Errorf("the agent logged errors:\n%s", w.Text())
	}
	reused := 0
	ips := map[string]bool{}
	for _, k := range append(slices.Clone(deleted), alive...) {
		if ips[k.ip] {
			reused++
		}
		ips[k.ip] = true
	}
	if reused == 0 {
		t.Errorf("no address was reused: the churn proves nothing")
	}
	t.Logf("%d cycles, %d addresses reused", *churnCycles, reused)
	w.Terminate(t)
}

// cacheEntry is libcni's cache file of a container's eth0 on network.
func cacheEntry(dir, network, id string) string {
	return filepath.Join(dir, "results", network+"-"+id+"-eth0")
}

// expectTable wants the node's host-port table (`portmap-agent list --json`)
// to hold exactly the live containers' mappings of the backend (and of
// the socket path when listArgs names its site): one per container and
// mechanism, to its address.
func expectTable(t *testing.T, b backend, listArgs []string, alive []*churned, when string) {
	t.Helper()
	var got, want []string
	entries := listEntries(t, listArgs...)
	for _, e := range entries {
		got = append(got, fmt.Sprintf("%s %d %s %s", e.Backend, e.HostPort, e.ContainerIP, e.ContainerID))
	}
	mechs := []string{b.name}
	if len(listArgs) > 0 {
		mechs = append(mechs, "localhost")
	}
	for _, k := range alive {
		for _, m := range mechs {
			want = append(want, fmt.Sprintf("%s %d %s %s", m, k.port, k.ip, k.c.ID))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: the host-port table is\n  %s\nwant the live containers'\n  %s", when, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// expectAccepts wants exactly the live containers' forwardAccept chains
// in iptables' filter table.
func expectAccepts(t *testing.T, alive []*churned, when string) {
	t.Helper()
	var got, want []string
	for _, l := range strings.Split(nettest.Run(t, "iptables", "-t", "filter", "-S"), "\n") {
		if c, ok := strings.CutPrefix(l, "-N "); ok && strings.HasPrefix(c, "CNI-FW-") {
			got = append(got, c)
		}
	}
	for _, k := range alive {
		want = append(want, iptables.AcceptChainName(plan.Owner{Network: "churn", ContainerID: k.c.ID, IfName: "eth0"}))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: forwardAccept chains %v, want the live containers' %v", when, got, want)
	}
}
