package e2e

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/test/deploy"
	"github.com/portmap-dev/portmap/test/nettest"
)

// linkPrograms are the IDs of the programs the site's links run, by hook.
func linkPrograms(t *testing.T, pinDir string) map[string]ebpf.ProgramID {
	t.Helper()
	ids := map[string]ebpf.ProgramID{}
	pins, _ := filepath.Glob(filepath.Join(pinDir, "v1", "*"))
	for _, pin := range pins {
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			continue // a map or a program
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids[filepath.Base(pin)] = info.Program
	}
	if len(ids) != 8 {
		t.Fatalf("%d links pinned in %s, want 8: %v", len(ids), pinDir, ids)
	}
	return ids
}

// The DaemonSet's agent with exactly the capabilities deploy/portmap.yaml
// gives its container (the runtime's defaults and what it adds; setpriv
// --bounding-set): a pass finds a socket-path site steady (no link
// updated or replaced), repairs a link removed behind its back, and finds
// it steady again. With one capability fewer (CAP_BPF, which the
// manifest gained in #55) a pass still finds the steady site steady, and
// where a link must be repaired skips the socket path with a warning
// naming CAP_BPF, repairs the rules all the same and does not fail:
// /healthz keeps passing. On Debian 12's 6.1 this is also the verifier judging the
// programs for a loader without CAP_PERFMON.
func TestSocketPathCapabilities(t *testing.T) {
	if !nfnl.ReleaseAtLeast(nfnl.Release(), 5, 14) {
		t.Skipf("Linux %s: the socket path needs 5.14 and is refused here", nfnl.Release())
	}
	daemonSet, err := deploy.AgentContainerCapabilities()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the DaemonSet's capabilities: %s", strings.Join(daemonSet, " "))
	withoutBPF := slices.DeleteFunc(slices.Clone(daemonSet), func(c string) bool { return c == "BPF" })

	site := nettest.NewCgroupSite(t)
	rt := nettest.NewRuntime(t, nettest.Net{Name: "sockcaps", CNIVersion: "1.1.0", V4: "192.0.2.192/27", V6: "2001:db8:192::/64",
		Extra: socketExtra(map[string]string{}, "socket", site)})
	c1 := rt.MustAdd(t, "k1", nettest.Mapping{HostPort: 7930, ContainerPort: srvPort, Protocol: "tcp"})
	nettest.Serve(t, c1.NS, "k1", srvPort)
	expectSocket(t, site, "tcp", "127.0.0.1:7930", "k1")

	steady := func(what string, caps []string) {
		t.Helper()
		before := linkPrograms(t, site.PinDir)
		rep, status := runSyncWith(t, caps, "--cache-dir", rt.CacheDir)
		if status != 0 || len(rep.Shared) != 0 || rep.Summary.Repaired != 0 || len(rep.NotRun) != 0 {
			t.Errorf("%s: exit %d, shared %+v, %d repaired, not run %+v; want a steady pass", what, status, rep.Shared, rep.Summary.Repaired, rep.NotRun)
		}
		if after := linkPrograms(t, site.PinDir); !maps.Equal(before, after) {
			t.Errorf("%s: the links' programs went from %v to %v: the pass replaced what was right", what, before, after)
		}
	}
	steady("the DaemonSet's pass over the site ADD made", daemonSet)

	// a link removed behind its back: the DaemonSet's agent puts it back
	connect4 := filepath.Join(site.PinDir, "v1", "connect4")
	if err := os.Remove(connect4); err != nil {
		t.Fatal(err)
	}
	expectSocketRefused(t, site, "tcp", "127.0.0.1:7930")
	rep, status := runSyncWith(t, daemonSet, "--cache-dir", rt.CacheDir)
	if status != 0 || len(rep.Shared) != 1 || !strings.Contains(rep.Shared[0].What, "connect4 missing") {
		t.Errorf("the DaemonSet's pass after connect4 was removed: exit %d, shared %+v, want connect4 repaired", status, rep.Shared)
	}
	expectSocket(t, site, "tcp", "127.0.0.1:7930", "k1")
	if err := rt.Check(c1); err != nil {
		t.Errorf("CHECK after the repair: %v", err)
	}
	steady("the pass after the repair", daemonSet)

	// without CAP_BPF: a steady site is read and found steady; a repair
	// is not run, the rules are repaired all the same
	steady("a pass without CAP_BPF", withoutBPF)
	if err := os.Remove(connect4); err != nil {
		t.Fatal(err)
	}
	backends[0].flushFirewall(t)
	rep, status = runSyncWith(t, withoutBPF, "--cache-dir", rt.CacheDir)
	if status != 0 || len(rep.NotRun) != 2 || !strings.Contains(rep.NotRun[0].What, "lacks CAP_BPF") {
		t.Errorf("a pass without CAP_BPF: exit %d, not run %+v; want exit 0 and both families of the socket path not run, naming CAP_BPF", status, rep.NotRun)
	}
	if rep.Summary.Repaired != 1 || len(rep.Attachments) != 1 || !strings.Contains(rep.Attachments[0].What, "not run (lacks CAP_BPF") {
		t.Errorf("a pass without CAP_BPF: %d repaired, attachments %+v; want the rules repaired and the socket path said not run", rep.Summary.Repaired, rep.Attachments)
	}
	if _, err := os.Stat(connect4); err == nil {
		t.Errorf("a pass without CAP_BPF put connect4 back")
	}
	// and the DaemonSet's next pass repairs it
	rep, status = runSyncWith(t, daemonSet, "--cache-dir", rt.CacheDir)
	if status != 0 || len(rep.Shared) != 1 {
		t.Errorf("the DaemonSet's pass after one without CAP_BPF: exit %d, shared %+v", status, rep.Shared)
	}
	expectSocket(t, site, "tcp", "127.0.0.1:7930", "k1")
	if err := rt.Del(c1); err != nil {
		t.Fatal(err)
	}
}
