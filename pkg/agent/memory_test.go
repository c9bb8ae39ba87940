package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/nft/nfttest"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
)

// owners is who a read of the in-memory kernel shows forwarding host
// ports, both families: "c1 8080".
func owners(t *testing.T, k *nfttest.Kernel) []string {
	t.Helper()
	var out []string
	for _, f := range plan.Families {
		ms, err := nftables.NewOn(f, io.Discard, k).Mappings()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			out = append(out, fmt.Sprintf("%s %d", m.Owner.ContainerID, m.HostPort))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// cachePod caches pod id of net1 with its IP 192.0.2.N (id cN) and host
// port port as libcni does after ADD, and returns its namespace.
func cachePod(t *testing.T, dir, id string, port int) string {
	t.Helper()
	ns := "/run/netns/" + id
	err := cnicache.Write(dir, cnicache.Entry{Network: "net1", ContainerID: id, IfName: "eth0", NetNS: ns,
		Conflist:       []byte(`{"cniVersion":"1.0.0","name":"net1","plugins":[{"type":"ptp"},{"type":"portmap","backend":"nftables","capabilities":{"portMappings":true}}]}`),
		CapabilityArgs: map[string]any{"portMappings": []any{map[string]any{"hostPort": port, "containerPort": 80}}},
		Result: map[string]any{"cniVersion": "1.0.0",
			"interfaces": []any{map[string]any{"name": "eth0", "sandbox": ns}},
			"ips":        []any{map[string]any{"address": "192.0.2." + id[1:] + "/24", "interface": 0}}}})
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestPruneOverMemory: a pruning pass on the real nftables backend over
// nf_tables in memory removes an orphan's rules only on evidence, judged
// by what a read of the kernel shows, what the report says and what the
// ledger keeps. c1 is cached throughout and keeps its rules; c2's stay
// after its cache entry went when the cache directory is missing or
// holds no entry, when the ledger holds a file that is not a record,
// when c2's record is a newer release's (cached or not), when its ADD is
// on record and its namespace lives, and when its DEL is on record
// while its cache entry is still there. They go once nothing but the
// cache speaks for c2, or its ADD's namespace is gone.
func TestPruneOverMemory(t *testing.T) {
	c2 := plan.Owner{Network: "net1", ContainerID: "c2", IfName: "eth0"}
	both := []string{"c1 8080", "c2 9090"}
	for _, tc := range []struct {
		name string
		// setup prepares the pass after c2's cache entry went: the cache
		// directory it reads, the ledger, the namespaces alive.
		setup func(t *testing.T, dir string, l *ledger.Dir, live map[string]bool) string
		want  []string
		err   error
		// says is what the pass's report says of it; record is c2's
		// ledger verb after the pass ("": none)
		says   string
		record ledger.Verb
	}{
		{"no cache directory", func(t *testing.T, dir string, _ *ledger.Dir, _ map[string]bool) string {
			return filepath.Join(dir, "typo")
		}, both, cnicache.ErrNoCache, "", ""},
		{"an empty cache directory", func(t *testing.T, _ string, _ *ledger.Dir, _ map[string]bool) string {
			return t.TempDir()
		}, both, nil, "holds no cache entries", ""},
		{"a ledger file that is not a record", func(t *testing.T, dir string, l *ledger.Dir, _ map[string]bool) string {
			writeLedgerFile(t, l, "0123456789abcdef0123456789abcdef", "{cut sho")
			return dir
		}, both, nil, "orphans not pruned: the ledger holds 1 files that are not records", ""},
		{"a newer release's record", func(t *testing.T, dir string, l *ledger.Dir, _ map[string]bool) string {
			if err := l.Write(ledger.New(c2, "pause")); err != nil {
				t.Fatal(err)
			}
			return dir
		}, both, nil, `kept: nftables ipv4 chain dn-6c270ef2f251d571-af0310d76926ea14: its ledger record says "pause"`, "pause"},
		{"a newer release's record of a cached pod", func(t *testing.T, dir string, l *ledger.Dir, _ map[string]bool) string {
			cachePod(t, dir, "c2", 9090)
			if err := l.Write(ledger.New(c2, "pause")); err != nil {
				t.Fatal(err)
			}
			return dir
		}, both, nil, "net1 c2 eth0: withheld (newer)", "pause"},
		{"its ADD on record, its namespace alive", func(t *testing.T, dir string, l *ledger.Dir, _ map[string]bool) string {
			r := ledger.New(c2, ledger.Add)
			r.NetNS = "/run/netns/c2"
			if err := l.Write(r); err != nil {
				t.Fatal(err)
			}
			return dir
		}, both, nil, "kept: nftables ipv4 chain dn-6c270ef2f251d571-af0310d76926ea14: its ADD is on record and its namespace alive", ledger.Add},
		{"its ADD on record, its namespace gone", func(t *testing.T, dir string, l *ledger.Dir, live map[string]bool) string {
			r := ledger.New(c2, ledger.Add)
			r.NetNS = "/run/netns/c2"
			delete(live, r.NetNS)
			if err := l.Write(r); err != nil {
				t.Fatal(err)
			}
			return dir
		}, []string{"c1 8080"}, nil, "pruned: nftables ipv4 chain dn-6c270ef2f251d571-af0310d76926ea14", ""},
		{"its DEL on record, its cache entry still there", func(t *testing.T, dir string, l *ledger.Dir, _ map[string]bool) string {
			cachePod(t, dir, "c2", 9090)
			if err := l.Write(ledger.New(c2, ledger.Del)); err != nil {
				t.Fatal(err)
			}
			return dir
		}, both, nil, "kept: nftables ipv4 chain dn-6c270ef2f251d571-af0310d76926ea14: its cache entry is the runtime's until its DEL returns", ledger.Del},
		{"no record", func(t *testing.T, dir string, _ *ledger.Dir, _ map[string]bool) string {
			return dir
		}, []string{"c1 8080"}, nil, "pruned: nftables ipv4 chain dn-6c270ef2f251d571-af0310d76926ea14", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := fakehost.New()
			k := fakehost.NFTablesInMemory(h)
			l := &ledger.Dir{Root: t.TempDir()}
			h.Ledger = l
			live := map[string]bool{}
			a := &Agent{Host: h, Gone: func(ns string) bool { return !live[ns] }}
			dir := t.TempDir()
			for id, port := range map[string]int{"c1": 8080, "c2": 9090} {
				live[cachePod(t, dir, id, port)] = true
			}
			rep, err := a.Sync(Options{CacheDir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if got := owners(t, k); !slices.Equal(got, both) {
				t.Fatalf("after a pass over both entries: %q, want %q; %+v", got, both, rep)
			}
			if err := os.Remove(filepath.Join(dir, "results", "net1-c2-eth0")); err != nil {
				t.Fatal(err)
			}
			rep, err = a.Sync(Options{CacheDir: tc.setup(t, dir, l, live), Prune: true})
			if !errors.Is(err, tc.err) {
				t.Fatalf("the pruning pass: %v, want %v", err, tc.err)
			}
			var out bytes.Buffer
			if rep != nil {
				rep.Write(&out, false)
			}
			if (tc.says == "") != (rep == nil) || !strings.Contains(out.String(), tc.says) {
				t.Errorf("the pass's report, want it to say %q:\n%s", tc.says, out.String())
			}
			if got := owners(t, k); !slices.Equal(got, tc.want) {
				t.Errorf("after the pruning pass: %q, want %q", got, tc.want)
			}
			recs, _, _ := l.Read()
			if got := recs[c2].Verb; got != tc.record {
				t.Errorf("c2's ledger record after the pass: %q, want %q", got, tc.record)
			}
		})
	}
}
