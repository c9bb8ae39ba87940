package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
)

// owners is who a read of the kernel in memory shows forwarding host
// ports, both families: "c1 8080".
func owners(t *testing.T, k fakehost.InMemory) []string {
	return k.Mapped(t, func(m plan.Installed) string { return fmt.Sprintf("%s %d", m.Owner.ContainerID, m.HostPort) })
}

// pass is what a case of TestPruneOverMemory prepares a pruning pass
// with: the ledger, the namespaces alive, and cache, which caches a pod
// of net1 with IP 192.0.2.N (id cN) and a host port as libcni does after
// ADD, with the backend under test.
type pass struct {
	ledger *ledger.Dir
	live   map[string]bool
	cache  func(id string, port int)
	// cacheIn caches a pod of network in the cache directory dir.
	cacheIn func(dir, network, id string, port int)
}

// TestPruneOverMemory: a pruning pass on each real backend over its
// kernel in memory removes an orphan's rules only on evidence, judged by
// what a read of the kernel shows, what the report says and what the
// ledger keeps. c1 is cached throughout and keeps its rules; c2's stay
// after its cache entry went when the cache directory is missing or
// holds no entry, when the ledger holds a file that is not a record,
// when the ledger is not there at all, when c2's record is a newer
// release's (cached or not), when its ADD is
// on record and its namespace lives, and when its DEL is on record
// while its cache entry is still there; and when the cache cannot name
// c2 gone: a results directory without entries, one with another
// network's only, c2's entry cut short, or one whose configuration ADD
// refuses. They go once nothing but the cache speaks for c2 (its
// network's entries, or its container's on another network), or its
// ADD's namespace is gone.
func TestPruneOverMemory(t *testing.T) {
	c2 := plan.Owner{Network: "net1", ContainerID: "c2", IfName: "eth0"}
	both := []string{"c1 8080", "c2 9090"}
	record := func(t *testing.T, p pass, v ledger.Verb) {
		r := ledger.New(c2, v)
		r.NetNS = "/run/netns/c2"
		if err := p.ledger.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		// setup prepares the pass after c2's cache entry went and
		// returns the cache directory it reads.
		setup func(t *testing.T, dir string, p pass) string
		want  []string
		err   error
		// says is what the pass's report says (each part); verb is c2's
		// ledger verb after the pass ("": no record)
		says []string
		verb ledger.Verb
	}{
		{"no cache directory", func(t *testing.T, dir string, _ pass) string {
			return filepath.Join(dir, "typo")
		}, both, cnicache.ErrNoCache, nil, ""},
		{"an empty cache directory", func(t *testing.T, _ string, _ pass) string {
			return t.TempDir()
		}, both, nil, []string{"holds no cache entries"}, ""},
		{"a ledger file that is not a record", func(t *testing.T, dir string, p pass) string {
			writeLedgerFile(t, p.ledger, "0123456789abcdef0123456789abcdef", "{cut sho")
			return dir
		}, both, nil, []string{"orphans not pruned: the ledger holds 1 files that are not records"}, ""},
		{"a newer release's record", func(t *testing.T, dir string, p pass) string {
			record(t, p, "pause")
			return dir
		}, both, nil, []string{"net1 c2 -: kept: ", `its ledger record says "pause"`}, "pause"},
		{"a newer release's record of a cached pod", func(t *testing.T, dir string, p pass) string {
			p.cache("c2", 9090)
			record(t, p, "pause")
			return dir
		}, both, nil, []string{"net1 c2 eth0: withheld (newer)"}, "pause"},
		{"its ADD on record, its namespace alive", func(t *testing.T, dir string, p pass) string {
			record(t, p, ledger.Add)
			return dir
		}, both, nil, []string{"net1 c2 -: kept: ", "its ADD is on record and its namespace alive"}, ledger.Add},
		{"its ADD on record, its namespace gone", func(t *testing.T, dir string, p pass) string {
			record(t, p, ledger.Add)
			delete(p.live, "/run/netns/c2")
			return dir
		}, []string{"c1 8080"}, nil, []string{"net1 c2 -: pruned: "}, ""},
		{"its DEL on record, its cache entry still there", func(t *testing.T, dir string, p pass) string {
			p.cache("c2", 9090)
			record(t, p, ledger.Del)
			return dir
		}, both, nil, []string{"net1 c2 -: kept: ", "its cache entry is the runtime's until its DEL returns"}, ledger.Del},
		{"no record", func(t *testing.T, dir string, _ pass) string {
			return dir
		}, []string{"c1 8080"}, nil, []string{"net1 c2 -: pruned: "}, ""},
		{"no ledger at all (the agent's /run is not the plugin's)", func(t *testing.T, dir string, p pass) string {
			if err := os.RemoveAll(p.ledger.Root); err != nil {
				t.Fatal(err)
			}
			return dir
		}, both, nil, []string{"orphans not pruned: ledger: ", "is not there: no ledger", "net1 c2 -: orphan"}, ""},
		{"a results directory without entries", func(t *testing.T, _ string, _ pass) string {
			empty := t.TempDir()
			if err := os.Mkdir(filepath.Join(empty, "results"), 0o700); err != nil {
				t.Fatal(err)
			}
			return empty
		}, both, nil, []string{"net1 c2 -: kept: ", `holds no entry of network "net1"`, "net1 c1 -: kept: "}, ""},
		{"another network's entries only", func(t *testing.T, _ string, p pass) string {
			other := t.TempDir()
			p.cacheIn(other, "net2", "c7", 7070)
			return other
		}, []string{"c1 8080", "c2 9090", "c7 7070"}, nil, []string{"net1 c2 -: kept: ", `holds no entry of network "net1"`}, ""},
		{"its cache entry cut short", func(t *testing.T, dir string, p pass) string {
			p.cache("c2", 9090)
			f := filepath.Join(dir, "results", "net1-c2-eth0")
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f, b[:len(b)/2], 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}, both, nil, []string{"net1 c2 -: kept: ", "its cache entry net1-c2-eth0 may be the one that cannot be used (not a cache entry: "}, ""},
		{"no entry of its network, its ADD on record and its namespace gone", func(t *testing.T, _ string, p pass) string {
			record(t, p, ledger.Add)
			delete(p.live, "/run/netns/c2")
			empty := t.TempDir()
			if err := os.Mkdir(filepath.Join(empty, "results"), 0o700); err != nil {
				t.Fatal(err)
			}
			return empty
		}, []string{"c1 8080"}, nil, []string{"net1 c2 -: pruned: ", "net1 c1 -: kept: "}, ""},
		{"no entry of its network, its container cached on another", func(t *testing.T, _ string, p pass) string {
			other := t.TempDir()
			p.cacheIn(other, "net2", "c2", 7070)
			return other
		}, []string{"c1 8080", "c2 7070"}, nil, []string{"net1 c2 -: pruned: ", "net1 c1 -: kept: "}, ""},
		{"its cache entry with a configuration ADD refuses", func(t *testing.T, dir string, p pass) string {
			p.cache("c2", 70000)
			return dir
		}, both, nil, []string{"net1 c2 -: kept: ", "its cache entry net1-c2-eth0 may be the one that cannot be used (invalid portmap configuration: "}, ""},
	} {
		for _, be := range []backend.Name{backend.NFTables, backend.IPTables} {
			t.Run(string(be)+"/"+tc.name, func(t *testing.T) {
				h, _ := fakehost.New()
				k := fakehost.BackendsInMemory(h)[be]
				p := pass{ledger: &ledger.Dir{Root: t.TempDir()}, live: map[string]bool{}}
				h.Ledger = p.ledger
				a := &Agent{Host: h, Gone: func(ns string) bool { return !p.live[ns] }}
				dir := t.TempDir()
				p.cacheIn = func(dir, network, id string, port int) {
					ns := "/run/netns/" + id
					p.live[ns] = true
					err := cnicache.Write(dir, cnicache.Entry{Network: network, ContainerID: id, IfName: "eth0", NetNS: ns,
						Conflist: []byte(`{"cniVersion":"1.0.0","name":"` + network + `","plugins":[{"type":"ptp"},
						  {"type":"portmap","backend":"` + string(be) + `","capabilities":{"portMappings":true}}]}`),
						CapabilityArgs: map[string]any{"portMappings": []any{map[string]any{"hostPort": port, "containerPort": 80}}},
						Result: map[string]any{"cniVersion": "1.0.0",
							"interfaces": []any{map[string]any{"name": "eth0", "sandbox": ns}},
							"ips":        []any{map[string]any{"address": "192.0.2." + id[1:] + "/24", "interface": 0}}}})
					if err != nil {
						t.Fatal(err)
					}
				}
				p.cache = func(id string, port int) { p.cacheIn(dir, "net1", id, port) }
				p.cache("c1", 8080)
				p.cache("c2", 9090)
				if _, err := a.Sync(Options{CacheDir: dir}); err != nil {
					t.Fatal(err)
				}
				if got := owners(t, k); !slices.Equal(got, both) {
					t.Fatalf("after a pass over both entries: %q, want %q", got, both)
				}
				if err := os.Remove(filepath.Join(dir, "results", "net1-c2-eth0")); err != nil {
					t.Fatal(err)
				}
				rep, err := a.Sync(Options{CacheDir: tc.setup(t, dir, p), Prune: true})
				if !errors.Is(err, tc.err) {
					t.Fatalf("the pruning pass: %v, want %v", err, tc.err)
				}
				var out bytes.Buffer
				if rep != nil {
					rep.Write(&out, false)
				}
				if (tc.says == nil) != (rep == nil) || slices.ContainsFunc(tc.says, func(s string) bool { return !strings.Contains(out.String(), s) }) {
					t.Errorf("the pass's report, want it to say %q:\n%s", tc.says, out.String())
				}
				if got := owners(t, k); !slices.Equal(got, tc.want) {
					t.Errorf("after the pruning pass: %q, want %q", got, tc.want)
				}
				recs, _, _ := p.ledger.Read()
				if got := recs[c2].Verb; got != tc.verb {
					t.Errorf("c2's ledger record after the pass: %q, want %q", got, tc.verb)
				}
			})
		}
	}
}
