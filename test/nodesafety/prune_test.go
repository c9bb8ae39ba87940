package nodesafety

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/test/nettest"
)

// TestPruneOnlyOnEvidence: a container mapped by upstream v1.10.0 (no
// ledger record of ours: a node mid-migration) keeps its host port
// through `portmap-agent sync --prune` given a cache directory that is
// not there (a wrong flag, a hostPath that mounts another directory, a
// wiped cache: the pass fails, naming it) or one that holds no entries
// (the pass prunes nothing and says why). Given a cache that holds
// entries and not this container's, the same pass prunes it: the
// evidence is there, so the test can fail.
func TestPruneOnlyOnEvidence(t *testing.T) {
	nettest.ResetNAT(t)
	cl := lan(t)
	up := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "up", V4: "192.0.2.32/28", Portmap: "portmap-upstream"}, t.TempDir())
	c := up.MustAdd(t, "upstreams", nettest.Mapping{HostPort: 6104, ContainerPort: srvPort, Protocol: "tcp"})
	nettest.Serve(t, c.NS, "upstreams", srvPort)
	answers := func(when string) {
		t.Helper()
		if got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6104)); err != nil || !strings.HasPrefix(got, "upstreams sees ") {
			t.Fatalf("%s: the upstream container's host port: %q, %v", when, got, err)
		}
		if save := nettest.Save(t, 4); !strings.Contains(save, `id: \"upstreams\"`) && !strings.Contains(save, `id: "upstreams"`) {
			t.Fatalf("%s: the upstream container's rules are gone:\n%s", when, save)
		}
		t.Logf("%s: the upstream container's host port answers, its rules are there", when)
	}
	answers("before")

	missing := filepath.Join(t.TempDir(), "no-such-dir")
	out, stderr, status, err := nettest.Agent("sync", "--prune", "--cache-dir", missing)
	if err != nil || status == 0 || !strings.Contains(stderr, "no such cache directory") || !strings.Contains(stderr, missing) {
		t.Errorf("sync --prune of a cache directory that is not there: exit %d, %v; want a failure naming it\n%s%s", status, err, out, stderr)
	}
	answers("after sync --prune --cache-dir " + missing)

	empty := t.TempDir()
	out, stderr, status, err = nettest.Agent("sync", "--prune", "--cache-dir", empty)
	if err != nil || status != 0 || !strings.Contains(out, "orphans not pruned: "+empty+" holds no cache entries") || !strings.Contains(out, "0 pruned") {
		t.Errorf("sync --prune of a cache without entries: exit %d, %v; want nothing pruned, and why\n%s%s", status, err, out, stderr)
	}
	answers("after sync --prune --cache-dir " + empty + " (no results)")

	// evidence: a cache of this node that holds another container
	ours := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "ours", V4: "192.0.2.48/28"}, t.TempDir())
	ours.MustAdd(t, "cached", nettest.Mapping{HostPort: 6105, ContainerPort: srvPort})
	out, stderr, status, err = nettest.Agent("sync", "--prune", "--cache-dir", ours.CacheDir)
	if err != nil || status != 0 || !strings.Contains(out, "upstreams -: pruned") {
		t.Errorf("sync --prune of a cache without the upstream container: exit %d, %v; want it pruned\n%s%s", status, err, out, stderr)
	}
	if got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6104)); err == nil {
		t.Errorf("the pruned host port still answers %q", got)
	}
}
