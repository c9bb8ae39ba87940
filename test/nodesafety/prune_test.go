package nodesafety

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/test/nettest"
)

// TestPruneOnlyOnEvidence: a container mapped by upstream v1.10.0 (no
// ledger record of ours: a node mid-migration) keeps its host port
// through `portmap-agent sync --prune`, run as the DaemonSet runs it,
// given a cache directory that is
// not there (a wrong flag, a hostPath that mounts another directory, a
// wiped cache: the pass fails, naming it), one that holds no entries
// (the pass prunes nothing and says why), one whose results directory
// is there and empty (a cache wiped by hand, another runtime's, Multus's:
// no entry of the container's network), and one where its own entry is
// cut to half its bytes (the file's name names it; the pass keeps it and
// says so). Given a cache that holds another container of its network
// and nothing of it, the same pass prunes it: the evidence is there, so
// the test can fail.
func TestPruneOnlyOnEvidence(t *testing.T) {
	nettest.ResetNAT(t)
	cl := lan(t)
	node := nettest.NewNode(t)
	cache := t.TempDir()
	up := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "up", V4: "192.0.2.32/28", Portmap: "portmap-upstream"}, cache)
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
	// a pass that skipped a cache file it should have read exits 1
	prune := func(dir string, exit int, says ...string) {
		t.Helper()
		out, stderr, status, err := podAgent(t, node, "sync", "--prune", "--cache-dir", dir)
		if err != nil || status != exit || slices.ContainsFunc(says, func(s string) bool { return !strings.Contains(out, s) }) {
			t.Errorf("sync --prune --cache-dir %s: exit %d, %v; want exit %d, saying %q\n%s%s", dir, status, err, exit, says, out, stderr)
		}
	}
	answers("before")

	missing := filepath.Join(t.TempDir(), "no-such-dir")
	out, stderr, status, err := podAgent(t, node, "sync", "--prune", "--cache-dir", missing)
	if err != nil || status == 0 || !strings.Contains(stderr, "no such cache directory") || !strings.Contains(stderr, missing) {
		t.Errorf("sync --prune of a cache directory that is not there: exit %d, %v; want a failure naming it\n%s%s", status, err, out, stderr)
	}
	answers("after sync --prune --cache-dir " + missing)

	empty := t.TempDir()
	prune(empty, 0, "orphans not pruned: "+empty+" holds no cache entries", "0 pruned")
	answers("after sync --prune --cache-dir " + empty + " (no results)")

	if err := os.Mkdir(filepath.Join(empty, "results"), 0o700); err != nil {
		t.Fatal(err)
	}
	prune(empty, 0, "up upstreams -: kept: ", `holds no entry of network "up"`, "0 pruned")
	answers("after sync --prune --cache-dir " + empty + " (an empty results directory)")

	// evidence of the network: another container of it, ours, cached
	ours := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "up", V4: "192.0.2.48/28"}, cache)
	ours.MustAdd(t, "cached", nettest.Mapping{HostPort: 6105, ContainerPort: srvPort})
	entry := filepath.Join(cache, "results", "up-upstreams-eth0")
	b, err := os.ReadFile(entry)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(entry, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	prune(cache, 1, "up upstreams -: kept: ", "its cache entry up-upstreams-eth0 may be the one that cannot be used", "0 pruned")
	answers("after sync --prune with its cache entry cut to half its bytes")

	if err := os.Remove(entry); err != nil {
		t.Fatal(err)
	}
	prune(cache, 0, "up upstreams -: pruned")
	if got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6104)); err == nil {
		t.Errorf("the pruned host port still answers %q", got)
	}
}
