package nodesafety

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/test/nettest"
)

// TestAgentAsDaemonSet: the agent run as the DaemonSet runs it — in a
// cgroup of its own below the node's root with a cgroup namespace rooted
// there, the node's / bind-mounted and given as --root, exactly the
// capabilities of deploy/portmap.yaml beside the runtime's defaults — on
// a node whose socket path lives at its default sites (no cgroupPath, no
// bpfPinDir). Its pass finds the hierarchy's root from its namespace
// (where mountinfo shows it as "/.."), finds the site ADD made steady,
// repairs a link removed behind its back, and leaves an attachment with
// "auto", for which ADD chose the socket path, on it: no NAT rule for
// 127.0.0.1 is written for it. Before, every pass failed: it found no
// hierarchy, and could not tell whether it may mount one (no
// CAP_SYS_PTRACE to read /proc/1/ns/mnt).
func TestAgentAsDaemonSet(t *testing.T) {
	if !nfnl.ReleaseAtLeast(nfnl.Release(), 5, 14) {
		t.Skipf("Linux %s: the socket path needs 5.14 and is refused here", nfnl.Release())
	}
	caps := daemonSetCaps(t)
	t.Logf("the DaemonSet's capabilities: %s", strings.Join(caps, " "))
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		node := nettest.NewNode(t)
		cache := t.TempDir()
		sock := map[string]string{"backend": extra["backend"], "localhost": `"socket"`}
		auto := map[string]string{"backend": extra["backend"], "localhost": `"auto"`}
		rs := node.Runtime(t, nettest.Net{Name: "ds-socket", V4: "192.0.2.128/28", Extra: sock}, cache)
		ra := node.Runtime(t, nettest.Net{Name: "ds-auto", V4: "192.0.2.144/28", Extra: auto}, cache)
		s1 := rs.MustAdd(t, "s1", nettest.Mapping{HostPort: 6500, ContainerPort: srvPort})
		a1 := ra.MustAdd(t, "a1", nettest.Mapping{HostPort: 6501, ContainerPort: srvPort})
		nettest.Serve(t, s1.NS, "s1", srvPort)
		nettest.Serve(t, a1.NS, "a1", srvPort)
		viaSocket := func(when string) {
			t.Helper()
			for port, want := range map[string]string{"6500": "s1", "6501": "a1"} {
				res, err := node.Site.Client("tcp", "127.0.0.1:"+port, false)
				if err != nil || !strings.HasPrefix(res.Reply, want+" sees ") {
					t.Errorf("%s: 127.0.0.1:%s from the node's cgroup: %+v %v, want %s's reply", when, port, res, err, want)
				}
			}
		}
		viaSocket("after ADD")
		natRules := localhostRules(t, backend)
		if _, err := os.Stat(filepath.Join(node.Site.PinDir, "v1", "connect4")); err != nil {
			t.Fatalf("ADD at the default sites pinned no link: %v", err)
		}

		pass := func(what string) agent.Report {
			t.Helper()
			out, stderr, status, err := node.AgentAsPod(caps, "sync", "--json", "--prune", "--cache-dir", cache)
			t.Logf("%s: exit %d\n%s%s", what, status, out, stderr)
			var rep agent.Report
			if err != nil || status != 0 || json.Unmarshal([]byte(out), &rep) != nil {
				t.Fatalf("%s: exit %d, %v: want a report\n%s", what, status, err, stderr)
			}
			if len(rep.NotRun) > 0 || rep.Summary.Errors > 0 || rep.Summary.Pruned > 0 {
				t.Errorf("%s: not run %+v, %d errors, %d pruned", what, rep.NotRun, rep.Summary.Errors, rep.Summary.Pruned)
			}
			return rep
		}
		rep := pass("the DaemonSet's pass over what ADD made")
		if len(rep.Shared) != 0 || rep.Summary.Repaired != 0 || rep.Summary.OK != 2 {
			t.Errorf("the first pass: shared %+v, %d repaired, %d ok; want both attachments ok and nothing written", rep.Shared, rep.Summary.Repaired, rep.Summary.OK)
		}
		if got := localhostRules(t, backend); got != natRules {
			t.Errorf("the pass wrote NAT rules for 127.0.0.1: %q, were %q", got, natRules)
		}
		viaSocket("after the pass")

		connect4 := filepath.Join(node.Site.PinDir, "v1", "connect4")
		if err := os.Remove(connect4); err != nil {
			t.Fatal(err)
		}
		rep = pass("the pass after connect4 was removed")
		if len(rep.Shared) != 1 || !strings.Contains(rep.Shared[0].What, "connect4 missing") {
			t.Errorf("the pass after connect4 was removed: shared %+v, want connect4 repaired", rep.Shared)
		}
		viaSocket("after the repair")
		rep = pass("the pass after the repair")
		if len(rep.Shared) != 0 || rep.Summary.Repaired != 0 {
			t.Errorf("the pass after the repair: shared %+v, %d repaired; want nothing", rep.Shared, rep.Summary.Repaired)
		}
		for _, c := range []struct {
			rt *nettest.Runtime
			c  *nettest.Container
		}{{rs, s1}, {ra, a1}} {
			if err := c.rt.Check(c.c); err != nil {
				t.Errorf("CHECK of %s after the passes: %v", c.c.ID, err)
			}
			if err := c.rt.Del(c.c); err != nil {
				t.Errorf("DEL of %s: %v", c.c.ID, err)
			}
		}
	})
}

// localhostRules are the lines of the backend's ruleset that match a
// source of 127.0.0.1 (the NAT path's localhost rules).
func localhostRules(t *testing.T, backend string) string {
	t.Helper()
	var text string
	if backend == "iptables" {
		text = nettest.Save(t, 4)
	} else {
		text = nettest.Run(t, "nft", "list", "ruleset")
	}
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, "127.0.0.1") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}
