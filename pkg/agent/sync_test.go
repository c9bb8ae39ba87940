package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/attach"
	"github.com/portmap-dev/portmap/pkg/caps"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/conntrack"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
)

// cacheEntry caches an attachment of network with portmap keys extra and
// the mappings, age old, as libcni would after ADD.
func cacheEntry(t *testing.T, dir, network, id, extra, mappings string, age time.Duration) {
	t.Helper()
	conflist := `{"cniVersion":"1.0.0","name":"` + network + `","plugins":[{"type":"ptp"},
	  {"type":"portmap","capabilities":{"portMappings":true}` + extra + `}]}`
	e := cnicache.Entry{Network: network, ContainerID: id, IfName: "eth0", Conflist: []byte(conflist),
		Result: map[string]any{"cniVersion": "1.0.0",
			"interfaces": []any{map[string]any{"name": "eth0", "sandbox": "/run/netns/" + id}},
			"ips":        []any{map[string]any{"address": "192.0.2.2/24", "interface": 0}}}}
	if mappings != "" {
		e.CapabilityArgs = map[string]any{"portMappings": jsonValue(t, mappings)}
	}
	if err := cnicache.Write(dir, e); err != nil {
		t.Fatal(err)
	}
	ts := time.Now().Add(-age)
	if err := os.Chtimes(filepath.Join(dir, "results", network+"-"+id+"-eth0"), ts, ts); err != nil {
		t.Fatal(err)
	}
}

func newFake() (*Agent, *fakehost.Host) {
	h, fh := fakehost.New()
	return &Agent{Host: h}, fh
}

func jsonValue(t *testing.T, s string) any {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSyncGroupsByBackendOldestFirst: each unit (backend and family) is
// asked for the cached attachments of its backend, oldest first (the
// oldest finds the shared route_localnet off and turns it on), every
// unit runs, the layers' too (each finds its orphans), under the host lock, and the
// repaired UDP port's flows are flushed.
func TestSyncGroupsByBackendOldestFirst(t *testing.T) {
	a, h := newFake()
	dir := t.TempDir()
	tcp := `[{"hostPort":8080,"containerPort":80}]`
	udp := `[{"hostPort":53,"containerPort":53,"protocol":"udp"}]`
	cacheEntry(t, dir, "net1", "young", "", tcp, time.Minute)
	cacheEntry(t, dir, "net1", "old", "", tcp, time.Hour)
	cacheEntry(t, dir, "net2", "nft", `,"backend":"nftables"`, udp, time.Hour)
	cacheEntry(t, dir, "net2", "none", "", "", time.Hour) // no mappings: nothing to keep
	// A unit answers: repaired for nft, ok for the others of its
	// backend, an error for one of another backend's; an orphan of its
	// own.
	h.SyncAnswer = func(be string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report {
		r := converge.NewReport(len(want))
		for i, pl := range want {
			switch {
			case (pl.Owner.ContainerID == "nft") != (be == "nftables"):
				r.Results[i] = converge.Result{State: converge.Error, What: "asked of " + be}
			case pl.Owner.ContainerID == "nft":
				r.Results[i] = converge.Result{State: converge.Repaired, What: "chain missing"}
			}
		}
		r.Orphans = []converge.Orphan{{Network: "gone", ContainerID: be + "-" + f.String(), Object: "chain CNI-DN-1"}}
		return r
	}
	rep, err := a.Sync(Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if h.Locks != 1 || !maps.Equal(h.Localnet, map[string]bool{"veth-192.0.2.2": true}) {
		t.Errorf("%d locks, route_localnet %v: want the pass under the lock, turning it on", h.Locks, h.Localnet)
	}
	if len(h.Flushed) != 1 || h.Flushed[0].Family != plan.IPv4 || h.Flushed[0].Protocol != plan.UDP || h.Flushed[0].Port != 53 {
		t.Errorf("flushed %+v, want the repaired attachment's UDP port 53", h.Flushed)
	}
	got := map[string]string{}
	for _, a := range rep.Attachments {
		got[a.ContainerID] = a.State + " " + a.What
	}
	// route_localnet was off on the (one, shared) host interface: the
	// oldest attachment's pass turns it on.
	if got["nft"] != "repaired ipv4: chain missing" || got["old"] != "repaired route_localnet off on veth-192.0.2.2" ||
		got["young"] != "ok " {
		t.Errorf("attachments %q", got)
	}
	if rep.Summary.NoMappings != 1 || rep.Summary.Orphans != 8 || rep.Failed() {
		t.Errorf("summary %+v", rep.Summary)
	}
	var out bytes.Buffer
	if err := rep.Write(&out, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"net2 nft eth0: repaired: ipv4: chain missing",
		"gone iptables-ipv4 -: orphan: iptables ipv4 chain CNI-DN-1",
		"gone nftables-ipv6 -: orphan: nftables ipv6 chain CNI-DN-1",
		"sync: 3 attachments: 1 ok, 2 repaired, 0 errors; 8 orphans, 0 pruned; 0 cache entries skipped, 1 without port mappings",
	} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestSyncDryRunAndScope(t *testing.T) {
	a, h := newFake()
	dir := t.TempDir()
	cacheEntry(t, dir, "net1", "a", "", `[{"hostPort":8080,"containerPort":80}]`, time.Hour)
	cacheEntry(t, dir, "net2", "b", "", `[{"hostPort":8081,"containerPort":80}]`, time.Hour)
	var mu sync.Mutex // the units of both families answer at once
	var scope func(string) bool
	var dry []string
	h.SyncAnswer = func(be string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report {
		mu.Lock()
		defer mu.Unlock()
		scope = o.InScope
		if !o.DryRun {
			dry = append(dry, be+" "+f.String())
		}
		return converge.NewReport(len(want))
	}
	rep, err := a.Sync(Options{CacheDir: dir, DryRun: true, Networks: []string{"net2"}})
	if err != nil {
		t.Fatal(err)
	}
	if h.Locks != 0 || len(h.Localnet) != 0 || len(dry) != 0 {
		t.Errorf("dry run: %d locks, route_localnet %v, units asked to write %q: want none", h.Locks, h.Localnet, dry)
	}
	if len(rep.Attachments) != 1 || rep.Attachments[0].ContainerID != "b" || rep.Attachments[0].State != "would repair" {
		t.Errorf("attachments %+v, want net2's b only, to be repaired", rep.Attachments)
	}
	if scope("net1") || !scope("net2") || scope("") {
		t.Error("--network net2: orphans of net1 or of unknown owners are in scope")
	}
}

func TestSyncReportsBadEntries(t *testing.T) {
	a, _ := newFake()
	dir := t.TempDir()
	cacheEntry(t, dir, "net1", "bad", `,"markMasqBit":40`, `[{"hostPort":8080,"containerPort":80}]`, time.Hour)
	if err := os.WriteFile(filepath.Join(dir, "results", "x-y-eth0"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := a.Sync(Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Skipped) != 2 || !rep.Failed() {
		t.Errorf("skipped %+v: want both, and a failed pass", rep.Skipped)
	}
	for _, s := range rep.Skipped {
		if filepath.Base(s.File) == "net1-bad-eth0" && !strings.Contains(s.Why, "markMasqBit 40") {
			t.Errorf("invalid config reported as %q", s.Why)
		}
	}
}

func TestSyncReportsBackendErrors(t *testing.T) {
	a, h := newFake()
	dir := t.TempDir()
	cacheEntry(t, dir, "net1", "a", "", `[{"hostPort":8080,"containerPort":80}]`, time.Hour)
	h.FailAll = errors.New("nft: permission denied")
	rep, err := a.Sync(Options{CacheDir: dir})
	if err == nil || !strings.Contains(err.Error(), "iptables backend: nft: permission denied") {
		t.Errorf("error %v, want the backend's named", err)
	}
	if rep == nil || len(rep.Attachments) != 1 || rep.Attachments[0].State != "error" || !rep.Failed() {
		t.Errorf("report %+v, want the attachment in error", rep)
	}
}

// A unit the agent was never given the means to run (the socket path in
// a container without CAP_BPF) is skipped with a warning: the pass goes
// on with the others and does not fail, and the attachment says what was
// not checked.
func TestSyncSkipsAUnitWithoutItsCapabilities(t *testing.T) {
	a, h := newFake()
	dir := t.TempDir()
	cacheEntry(t, dir, "net1", "a", `,"localhost":"socket"`, `[{"hostPort":8080,"containerPort":80}]`, time.Hour)
	lacks := &caps.Error{Missing: []caps.Any{{caps.BPF, caps.SysAdmin}}, Err: fmt.Errorf("socket path: load program: %w", unix.EPERM)}
	h.FailSync["localhost ipv4"] = fmt.Errorf("ipv4: %w", lacks)
	h.FailSync["localhost ipv6"] = fmt.Errorf("ipv6: %w", lacks)
	h.SyncAnswer = func(name string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report {
		r := converge.NewReport(len(want))
		if name == "iptables" && f == plan.IPv4 && len(want) == 1 {
			r.Results[0] = converge.Result{State: converge.Repaired, What: "chain missing"}
		}
		return r
	}
	rep, err := a.Sync(Options{CacheDir: dir})
	if err != nil || rep.Failed() {
		t.Fatalf("pass: %v, failed %v; want a warning, not a failure", err, rep != nil && rep.Failed())
	}
	if len(rep.NotRun) != 2 || rep.NotRun[0].Backend != "localhost" || !strings.Contains(rep.NotRun[0].What, "lacks CAP_BPF or CAP_SYS_ADMIN") {
		t.Errorf("not run: %+v, want both families of the socket path, naming the capability", rep.NotRun)
	}
	if len(rep.Attachments) != 1 || rep.Attachments[0].State != "repaired" || !strings.Contains(rep.Attachments[0].What, "localhost ipv4 not run (lacks CAP_BPF or CAP_SYS_ADMIN)") {
		t.Errorf("attachments %+v, want the iptables repair and the socket path not run", rep.Attachments)
	}
	var out bytes.Buffer
	if err := rep.Write(&out, false); err != nil || !strings.Contains(out.String(), "shared localhost ipv4: not run: ") {
		t.Errorf("report:\n%s", out.String())
	}
}

// TestPassesKeepParsedEntries: in watch mode a pass parses only the cache
// files that changed since the last one, and reaches the same plans.
func TestPassesKeepParsedEntries(t *testing.T) {
	a, h := newFake()
	dir := t.TempDir()
	cacheEntry(t, dir, "net1", "a", "", `[{"hostPort":8080,"containerPort":80}]`, time.Hour)
	cacheEntry(t, dir, "net1", "b", "", `[{"hostPort":9090,"containerPort":90}]`, time.Minute)
	var wanted []string // what the backends were asked to keep, pass by pass
	h.SyncAnswer = func(be string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report {
		for _, pl := range want {
			wanted = append(wanted, fmt.Sprintf("%s %s %s %v", be, f, pl.Owner.ContainerID, pl.Mappings))
		}
		return converge.NewReport(len(want))
	}
	a.parsed = &parsedCache{reader: &cnicache.Reader{PluginType: "portmap"}}
	pass := func(wantParsed int) []string {
		t.Helper()
		wanted = nil
		if _, err := a.Sync(Options{CacheDir: dir}); err != nil {
			t.Fatal(err)
		}
		if a.parsed.reader.Parsed != wantParsed || len(a.parsed.configs) != 2 {
			t.Errorf("the pass parsed %d files and keeps %d configurations, want %d and 2", a.parsed.reader.Parsed, len(a.parsed.configs), wantParsed)
		}
		slices.Sort(wanted)
		return wanted
	}
	first, second := pass(2), pass(0)
	if len(first) != 2 || !slices.Equal(first, second) {
		t.Errorf("a pass from kept entries wants\n%q\nthe first wanted\n%q", second, first)
	}
	// A rewritten entry is parsed again, and its new mappings are used.
	cacheEntry(t, dir, "net1", "b", "", `[{"hostPort":9191,"containerPort":91}]`, time.Second)
	if got := pass(1); !strings.Contains(strings.Join(got, "\n"), "9191") {
		t.Errorf("after a rewrite the pass wants %q", got)
	}
}

// A pass prunes only on evidence: a cache directory that is not there is
// an error of the pass (nothing read, nothing written); one without
// results, where libcni has written no entry, prunes nothing and says
// why; a ledger file that is not a record is reported and prunes
// nothing (it may be any orphan's) without failing the pass; a record of
// a newer release's verb withholds its cached attachment and keeps its
// objects.
// writeLedgerFile writes a file named name among l's records (made, by
// a record written and forgotten, where there is none).
func writeLedgerFile(t *testing.T, l *ledger.Dir, name, content string) string {
	t.Helper()
	o := plan.Owner{Network: "net0", ContainerID: "c0", IfName: "eth0"}
	if err := l.Write(ledger.New(o, ledger.Add)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Forget(o); err != nil {
		t.Fatal(err)
	}
	var dir string
	filepath.WalkDir(l.Root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == ".epoch" {
			dir = filepath.Dir(p)
		}
		return nil
	})
	file := filepath.Join(dir, name)
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// A pass flushes the conntrack entries of the attachments whose rules it
// wrote (or the shared ones they hang from), telling the flush where each
// port goes so that the flows translated right stay; one that turned
// route_localnet back on alone changed no translation, and flushes
// nothing.
func TestSyncFlushesOnlyWhatItRewrote(t *testing.T) {
	udp := `[{"hostPort":53,"containerPort":5353,"protocol":"udp"}]`
	for _, tt := range []struct {
		name   string
		answer converge.Report
		want   []conntrack.Port
	}{
		{"route_localnet alone", converge.Report{}, nil},
		{"its rules", converge.Report{Results: []converge.Result{{State: converge.Repaired, What: "chain missing"}}},
			[]conntrack.Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 53, To: netip.MustParseAddrPort("192.0.2.2:5353")}}},
		{"the shared rules", converge.Report{Shared: []string{"jump missing"}, Wrote: true},
			[]conntrack.Port{{Family: plan.IPv4, Protocol: plan.UDP, Port: 53, To: netip.MustParseAddrPort("192.0.2.2:5353")}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, h := newFake()
			dir := t.TempDir()
			cacheEntry(t, dir, "net1", "c1", "", udp, time.Minute)
			h.SyncAnswer = func(be string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report {
				r := converge.NewReport(len(want))
				if len(want) > 0 {
					r.Shared, r.Wrote = tt.answer.Shared, tt.answer.Wrote
					copy(r.Results, tt.answer.Results)
				}
				return r
			}
			rep, err := a.Sync(Options{CacheDir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Attachments) != 1 || rep.Attachments[0].State != string(converge.Repaired) {
				t.Fatalf("attachments %+v, want c1 repaired", rep.Attachments)
			}
			if !slices.Equal(h.Flushed, tt.want) {
				t.Errorf("flushed %+v, want %+v", h.Flushed, tt.want)
			}
		})
	}
}

// A pass plans an attachment that said "localhost": "auto" as its ADD
// resolved it, which the ADD's ledger record says: the agent, in another
// mount namespace, may see the socket path's filesystems otherwise than
// the runtime's plugin did, and would rewrite the attachment to the other
// path on every pass. A record of a release before says nothing, and the
// pass resolves as it sees.
func TestSyncResolvesAutoAsADDDid(t *testing.T) {
	for _, tt := range []struct {
		name     string
		recorded plan.Localhost
		ready    error // what the agent's own look at the socket path finds
		want     plan.Localhost
	}{
		{"ADD chose the socket path, the agent would not", plan.LocalhostSocket, errors.New("no bpf filesystem here"), plan.LocalhostSocket},
		{"ADD chose NAT, the agent would not", plan.LocalhostNAT, nil, plan.LocalhostNAT},
		{"a record of a release before", "", nil, plan.LocalhostSocket},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, h := newFake()
			a.Host.SocketReady = func(*plan.Request) error { return tt.ready }
			a.Host.Ledger = &ledger.Dir{Root: t.TempDir()}
			a.Gone = func(string) bool { return false }
			dir := t.TempDir()
			cacheEntry(t, dir, "net1", "c1", `,"localhost":"auto"`, `[{"hostPort":8080,"containerPort":80}]`, time.Minute)
			atts, _, err := cnicache.Read(dir, "portmap")
			if err != nil || len(atts) != 1 {
				t.Fatalf("the cache: %v %v", atts, err)
			}
			loaded, err := attach.Load(a.Host, atts[0].Stdin, "c1", "eth0")
			if err != nil {
				t.Fatal(err)
			}
			r := ledger.New(loaded.Request.Owner, ledger.Add)
			r.NetNS, r.Plans, r.Localhost = "/run/netns/c1", plan.Fingerprint(loaded.Plans), tt.recorded
			if err := a.Host.Ledger.Write(r); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			planned := map[string]plan.Localhost{}
			h.SyncAnswer = func(be string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report {
				mu.Lock()
				defer mu.Unlock()
				for _, pl := range want {
					planned[be] = pl.Localhost
				}
				return converge.NewReport(len(want))
			}
			if _, err := a.Sync(Options{CacheDir: dir}); err != nil {
				t.Fatal(err)
			}
			if planned["iptables"] != tt.want {
				t.Errorf("the pass planned c1 with localhost %q, want %q (%v)", planned["iptables"], tt.want, planned)
			}
		})
	}
}
