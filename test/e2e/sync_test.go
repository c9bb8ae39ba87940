package e2e

import (
	"encoding/base64"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/sysctl"
	"github.com/portmap-dev/portmap/test/nettest"
)

// syncReport is the part of `portmap-agent sync --json` the tests read.
type syncReport struct {
	Attachments []struct {
		Network, ContainerID, State, What string
	}
	Orphans []struct {
		Network, ContainerID, Backend, Object, State string
	}
	Kept     []struct{ Network, ContainerID, Backend, Object, State, Error string }
	Withheld []struct{ Network, ContainerID, IfName, Reason, Why string }
	Shared   []struct{ Backend, Family, What string }
	Removed  []struct{ Backend, Family, What string }
	Skipped  []struct {
		File, Why string
		Error     bool
	}
	NotRun  []struct{ Backend, Family, What string }
	Summary struct{ OK, Repaired, Errors int }
}

// runSync runs `portmap-agent sync --json` with args and returns the report and
// the exit status.
func runSync(t *testing.T, args ...string) (syncReport, int) {
	t.Helper()
	return runSyncWith(t, nil, args...)
}

// runSyncWith is runSync with exactly the capabilities caps (nil: all).
func runSyncWith(t *testing.T, caps []string, args ...string) (syncReport, int) {
	t.Helper()
	args = append([]string{"sync", "--json"}, args...)
	out, stderr, status, err := nettest.AgentWith(caps, args...)
	if err != nil {
		t.Fatalf("portmap-agent sync: %v\n%s", err, stderr)
	}
	var r syncReport
	t.Logf("portmap-agent %s: exit %d\n%s%s", strings.Join(args, " "), status, out, stderr)
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("portmap-agent sync %v: exit %d, output is not a report: %v\n%s\n%s", args, status, err, out, stderr)
	}
	return r, status
}

func states(r syncReport) map[string]string {
	m := map[string]string{}
	for _, a := range r.Attachments {
		m[a.Network+"/"+a.ContainerID] = a.State
	}
	return m
}

// TestSyncRepairsAfterFlush: three containers on two networks, a flush of
// the firewall in the node, no traffic; `portmap-agent sync` brings every host
// port back, CHECK passes, and a second sync changes nothing, byte for
// byte.
func TestSyncRepairsAfterFlush(t *testing.T) {
	flushes := map[string][]struct {
		name string
		cmds [][]string
	}{
		"iptables": {
			{"iptables -t nat -F", [][]string{{"iptables", "-t", "nat", "-F"}, {"ip6tables", "-t", "nat", "-F"}}},
			{"nft flush ruleset", [][]string{{"nft", "flush", "ruleset"}}},
		},
		"nftables": {
			{"nft flush ruleset", [][]string{{"nft", "flush", "ruleset"}}},
		},
	}
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		for _, fl := range flushes[b.name] {
			t.Run(fl.name, func(t *testing.T) {
				nettest.ResetNAT(t)
				cl := client(t)
				cache := t.TempDir()
				rtA := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "sync-a", V4: "192.0.2.0/28", V6: "2001:db8:1:40::/64", Extra: extra}, cache)
				rtB := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "sync-b", V4: "192.0.2.16/28", Extra: extra}, cache)
				a1 := rtA.MustAdd(t, "a1", nettest.Mapping{HostPort: 6001, ContainerPort: srvPort},
					nettest.Mapping{HostPort: 6053, ContainerPort: srvPort, Protocol: "udp"})
				a2 := rtA.MustAdd(t, "a2", nettest.Mapping{HostPort: 6002, ContainerPort: srvPort})
				b1 := rtB.MustAdd(t, "b1", nettest.Mapping{HostPort: 6003, ContainerPort: srvPort})
				for _, c := range []*nettest.Container{a1, a2, b1} {
					nettest.Serve(t, c.NS, c.ID, srvPort)
				}
				reach := []struct{ proto, to, name, src string }{
					{"tcp", addr(nodeIP, 6001), "a1", clientIP},
					{"udp", addr(nodeIP, 6053), "a1", clientIP},
					{"tcp", addr(nodeIP6, 6001), "a1", clientV6},
					{"tcp", addr(nodeIP, 6002), "a2", clientIP},
					{"tcp", addr(nodeIP, 6003), "b1", clientIP},
				}
				for _, r := range reach {
					expectReply(t, cl, r.proto, r.to, r.name, r.src)
				}

				r, status := runSync(t, "--cache-dir", cache)
				if status != 0 || len(r.Attachments) != 3 {
					t.Fatalf("sync before the flush: exit %d, %+v", status, r)
				}
				for k, s := range states(r) {
					if s != "ok" {
						t.Errorf("before the flush, %s is %q, want ok", k, s)
					}
				}

				for _, c := range fl.cmds {
					nettest.Run(t, c[0], c[1:]...)
				}
				// A recreated host interface: route_localnet is off again.
				hostIf, err := sysctl.Host{}.HostInterface(net.ParseIP(a2.IP(4)))
				if err != nil || hostIf == "" {
					t.Fatalf("host interface of a2: %q, %v", hostIf, err)
				}
				localnet := "/proc/sys/net/ipv4/conf/" + hostIf + "/route_localnet"
				if err := os.WriteFile(localnet, []byte("0"), 0o644); err != nil {
					t.Fatal(err)
				}
				for _, r := range reach {
					expectNoReply(t, cl, r.proto, r.to)
				}

				r, status = runSync(t, "--cache-dir", cache)
				if status != 0 {
					t.Errorf("sync after the flush: exit %d: %+v", status, r)
				}
				for _, a := range r.Attachments {
					if a.State != "repaired" || a.What == "" {
						t.Errorf("after the flush, %s/%s is %q (%s), want repaired with what", a.Network, a.ContainerID, a.State, a.What)
					}
				}
				for _, a := range r.Attachments {
					if a.ContainerID == "a2" && !strings.Contains(a.What, "route_localnet off on "+hostIf) {
						t.Errorf("a2 repaired %q, want route_localnet named", a.What)
					}
				}
				if v, _ := os.ReadFile(localnet); strings.TrimSpace(string(v)) != "1" {
					t.Errorf("route_localnet of %s is %q after sync, want 1", hostIf, v)
				}
				expectReply(t, nil, "tcp", addr("127.0.0.1", 6002), "a2", "")
				for _, rr := range reach {
					expectReply(t, cl, rr.proto, rr.to, rr.name, rr.src)
				}
				for _, x := range []struct {
					rt *nettest.Runtime
					c  *nettest.Container
				}{{rtA, a1}, {rtA, a2}, {rtB, b1}} {
					if err := x.rt.Check(x.c); err != nil {
						t.Errorf("CHECK %s after sync: %v", x.c.ID, err)
					}
				}

				before := b.ruleset(t) + nettest.Save(t, 4) + nettest.Save(t, 6)
				r, status = runSync(t, "--cache-dir", cache)
				if status != 0 || len(r.Shared) != 0 {
					t.Errorf("second sync: exit %d, shared %+v", status, r.Shared)
				}
				for k, s := range states(r) {
					if s != "ok" {
						t.Errorf("second sync: %s is %q, want ok", k, s)
					}
				}
				if after := b.ruleset(t) + nettest.Save(t, 4) + nettest.Save(t, 6); after != before {
					t.Errorf("second sync changed the ruleset:\n--- before\n%s\n--- after\n%s", before, after)
				}
			})
		}
	})
}

// TestSyncOrphans: mappings whose owner has no cache entry — planted by
// the upstream plugin, and left by a network renamed in the conflist —
// are listed, and removed by --prune; the cached ones stay. Those our
// plugin made without a runtime's cache entry are kept while the
// container's namespace lives (a runtime may be about to cache it:
// pkg/ledger), and are orphans once it is gone.
func TestSyncOrphans(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := client(t)
		cache := t.TempDir()
		rt := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "orph", V4: "192.0.2.0/28", Extra: extra}, cache)
		kept := rt.MustAdd(t, "kept", nettest.Mapping{HostPort: 6101, ContainerPort: srvPort})
		nettest.Serve(t, kept.NS, "kept", srvPort)

		// Renamed: the container was ADDed on "orph-old"; the runtime's
		// cache now knows it on "orph-new" only.
		other := t.TempDir()
		old := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "orph-old", V4: "192.0.2.16/28", Extra: extra}, other)
		renamed := old.MustAdd(t, "renamed", nettest.Mapping{HostPort: 6102, ContainerPort: srvPort})
		nettest.Serve(t, renamed.NS, "renamed", srvPort)
		renew := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "orph-new", V4: "192.0.2.32/28", Extra: extra}, cache)
		renew.MustAdd(t, "renamed", nettest.Mapping{HostPort: 6105, ContainerPort: srvPort})

		// No runtime at all: the plugin run alone (a runtime that lost its
		// cache, or crashed before DEL).
		lost := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "orph-lost", V4: "192.0.2.48/28", Extra: extra}, t.TempDir())
		gone := lost.MustAdd(t, "gone", nettest.Mapping{HostPort: 6103, ContainerPort: srvPort})
		nettest.Serve(t, gone.NS, "gone", srvPort)

		planted := map[string]int{"renamed": 6102, "gone": 6103}
		orphans := map[string]int{"renamed": 6102}
		if upstreamRuns(t, b) {
			// The upstream plugin's own rules, of a container not cached,
			// on a network the cache holds (its evidence: docs/safety.md).
			up := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "orph", V4: "192.0.2.64/28", Portmap: "portmap-upstream", Extra: extra}, t.TempDir())
			upc := up.MustAdd(t, "upstream", nettest.Mapping{HostPort: 6104, ContainerPort: srvPort, Protocol: "tcp"})
			nettest.Serve(t, upc.NS, "upstream", srvPort)
			planted["upstream"], orphans["upstream"] = 6104, 6104
		}
		for id, port := range planted {
			expectReply(t, cl, "tcp", addr(nodeIP, port), id, clientIP)
		}

		r, status := runSync(t, "--cache-dir", cache)
		if status != 0 {
			t.Errorf("sync: exit %d", status)
		}
		found := map[string]string{}
		for _, o := range r.Orphans {
			found[o.ContainerID] = o.State
			if o.Backend != b.name {
				t.Errorf("orphan %+v of backend %s, want %s", o, o.Backend, b.name)
			}
		}
		for id := range orphans {
			if found[id] != "orphan" {
				t.Errorf("orphan %q: state %q, want orphan; report %+v", id, found[id], r.Orphans)
			}
		}
		if _, ok := found["kept"]; ok {
			t.Errorf("cached container reported as orphan: %+v", r.Orphans)
		}
		expectKept := func(r syncReport) {
			t.Helper()
			if _, ok := found["gone"]; ok || len(r.Kept) == 0 {
				t.Errorf("the uncached container with a living namespace: orphans %+v, kept %+v; want it kept", r.Orphans, r.Kept)
			}
			for _, k := range r.Kept {
				if k.ContainerID != "gone" || k.State != "kept" || !strings.Contains(k.Error, "namespace alive") {
					t.Errorf("kept %+v, want only the uncached container with a living namespace, saying why", k)
				}
			}
		}
		expectKept(r)
		for id, port := range planted {
			expectReply(t, cl, "tcp", addr(nodeIP, port), id, clientIP) // listed, not removed
		}

		before := b.ruleset(t)
		r, _ = runSync(t, "--cache-dir", cache, "--prune", "--dry-run")
		if after := b.ruleset(t); after != before {
			t.Errorf("--dry-run changed the ruleset")
		}
		if len(r.Orphans) != len(found) {
			t.Errorf("--dry-run reports %d orphans, want %d", len(r.Orphans), len(found))
		}

		r, status = runSync(t, "--cache-dir", cache, "--prune")
		if status != 0 {
			t.Errorf("sync --prune: exit %d: %+v", status, r)
		}
		for _, o := range r.Orphans {
			if o.State != "pruned" {
				t.Errorf("sync --prune: orphan %+v not pruned", o)
			}
		}
		expectKept(r)
		for _, port := range orphans {
			expectNoReply(t, cl, "tcp", addr(nodeIP, port))
		}
		expectReply(t, cl, "tcp", addr(nodeIP, 6103), "gone", clientIP)
		expectReply(t, cl, "tcp", addr(nodeIP, 6101), "kept", clientIP)
		if err := rt.Check(kept); err != nil {
			t.Errorf("CHECK of the cached container after prune: %v", err)
		}

		// Its runtime crashed and its namespace is gone: now an orphan.
		nettest.DeleteNS(gone.NS)
		r, _ = runSync(t, "--cache-dir", cache, "--prune")
		if len(r.Orphans) == 0 || len(r.Kept) != 0 {
			t.Errorf("sync --prune after the namespace went: orphans %+v kept %+v, want the container's pruned", r.Orphans, r.Kept)
		}
		for _, o := range r.Orphans {
			if o.ContainerID != "gone" || o.State != "pruned" {
				t.Errorf("orphan %+v, want only the gone container's, pruned", o)
			}
		}
		expectNoReply(t, cl, "tcp", addr(nodeIP, 6103))
		r, _ = runSync(t, "--cache-dir", cache, "--prune")
		if len(r.Orphans)+len(r.Kept) != 0 {
			t.Errorf("last sync --prune still finds orphans %+v or keeps %+v", r.Orphans, r.Kept)
		}
	})
}

// TestSyncCorruptCache: a truncated entry, one of an unknown kind and one
// of a network without portmap are reported by file and skipped; the
// valid entry is still synced (here: repaired after a flush).
func TestSyncCorruptCache(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := client(t)
		cache := t.TempDir()
		rt := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "corrupt", V4: "192.0.2.0/28", Extra: extra}, cache)
		c := rt.MustAdd(t, "valid", nettest.Mapping{HostPort: 6201, ContainerPort: srvPort})
		nettest.Serve(t, c.NS, "valid", srvPort)
		results := filepath.Join(cache, "results")
		valid, err := os.ReadFile(filepath.Join(results, "corrupt-valid-eth0"))
		if err != nil {
			t.Fatal(err)
		}
		write := func(name, content string) {
			if err := os.WriteFile(filepath.Join(results, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write("corrupt-truncated-eth0", string(valid[:len(valid)/2]))
		write("corrupt-kind-eth0", strings.Replace(string(valid), `"cniCacheV1"`, `"cniCacheV9"`, 1))
		write("plain-noportmap-eth0", `{"kind":"cniCacheV1","containerId":"noportmap","ifName":"eth0","networkName":"plain",`+
			`"config":"`+b64(`{"cniVersion":"1.0.0","name":"plain","plugins":[{"type":"ptp"}]}`)+`"}`)

		nettest.ResetNAT(t)
		expectNoReply(t, cl, "tcp", addr(nodeIP, 6201))
		r, status := runSync(t, "--cache-dir", cache)
		if status != 1 {
			t.Errorf("sync with corrupt entries: exit %d, want 1", status)
		}
		if s := states(r)["corrupt/valid"]; s != "repaired" {
			t.Errorf("valid entry: %q, want repaired", s)
		}
		expectReply(t, cl, "tcp", addr(nodeIP, 6201), "valid", clientIP)
		want := map[string]bool{"corrupt-truncated-eth0": true, "corrupt-kind-eth0": true, "plain-noportmap-eth0": false}
		got := map[string]bool{}
		for _, s := range r.Skipped {
			got[filepath.Base(s.File)] = s.Error
		}
		for f, isErr := range want {
			if e, ok := got[f]; !ok || e != isErr {
				t.Errorf("skipped %s: reported %v (error %v), want error %v; %+v", f, ok, e, isErr, r.Skipped)
			}
		}
	})
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestSyncKeepsNewestWinner: two containers map the same host port, the
// newer ADD wins; after a flush, sync gives the port to the newer one
// again (the cache entry's age decides), not to whichever it repaired
// last.
func TestSyncKeepsNewestWinner(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := client(t)
		cache := t.TempDir()
		rt := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "newest", V4: "192.0.2.0/28", Extra: extra}, cache)
		older := rt.MustAdd(t, "older", nettest.Mapping{HostPort: 6601, ContainerPort: srvPort})
		nettest.Serve(t, older.NS, "older", srvPort)
		// Cache files carry the ADD's time; make the order unmistakable.
		past := time.Now().Add(-time.Minute)
		if err := os.Chtimes(filepath.Join(cache, "results", "newest-older-eth0"), past, past); err != nil {
			t.Fatal(err)
		}
		newer := rt.MustAdd(t, "newer", nettest.Mapping{HostPort: 6601, ContainerPort: srvPort})
		nettest.Serve(t, newer.NS, "newer", srvPort)
		expectReply(t, cl, "tcp", addr(nodeIP, 6601), "newer", clientIP)

		for _, flushOnly := range []string{"older", ""} {
			if flushOnly == "older" {
				// Only the older one's rules are gone: repairing it must not
				// take the port from the newer one.
				b.deleteDNAT(t, plan.Owner{Network: "newest", ContainerID: "older", IfName: "eth0"}, older, 6601)
			} else {
				nettest.ResetNAT(t)
				expectNoReply(t, cl, "tcp", addr(nodeIP, 6601))
			}
			r, status := runSync(t, "--cache-dir", cache)
			if status != 0 || states(r)["newest/older"] != "repaired" {
				t.Errorf("sync (%q flushed): exit %d, %+v", flushOnly, status, r.Attachments)
			}
			expectReply(t, cl, "tcp", addr(nodeIP, 6601), "newer", clientIP)
		}
	})
}
