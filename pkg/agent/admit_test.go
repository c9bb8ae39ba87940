package agent

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/attach"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// The admission's two decisions as tables: which cached attachments a
// pass may write for, and whose uncached objects it must keep.
func TestAdmission(t *testing.T) {
	epoch := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	owner := func(net, id string) plan.Owner { return plan.Owner{Network: net, ContainerID: id, IfName: "eth0"} }
	plans := func(ip string) []*plan.Plan {
		_, n, _ := net.ParseCIDR(ip + "/24")
		n.IP = net.ParseIP(ip).To4()
		return []*plan.Plan{{Family: plan.IPv4, ContainerNet: n, Mappings: plan.MappingsOf(plan.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP})}}
	}
	add := func(o plan.Owner, netns, ip string) ledger.Record {
		r := ledger.New(o, ledger.Add)
		r.NetNS, r.Plans = netns, plan.Fingerprint(plans(ip))
		return r
	}
	gone := func(p string) bool { return p == "/run/netns/dead" }
	records := map[plan.Owner]ledger.Record{}
	for _, r := range []ledger.Record{
		add(owner("n", "ok"), "/run/netns/ok", "192.0.2.2"),
		add(owner("n", "readded"), "/run/netns/readded", "192.0.2.9"),
		add(owner("n", "dead"), "/run/netns/dead", "192.0.2.3"),
		add(owner("n", "pending"), "/run/netns/pending", "192.0.2.4"),
		add(owner("old", "moved"), "/run/netns/moved", "192.0.2.5"),
		ledger.New(owner("n", "legacydel"), ledger.Del),
	} {
		records[r.Owner()] = r
	}
	at := func(net, id, netns string, mod time.Time) cnicache.Attachment {
		return cnicache.Attachment{Network: net, ContainerID: id, IfName: "eth0", NetNS: netns, ModTime: mod}
	}
	after, before := epoch.Add(time.Minute), epoch.Add(-time.Minute)
	atts := []cnicache.Attachment{
		at("n", "ok", "/run/netns/ok", after),
		at("n", "readded", "/run/netns/readded", after),
		at("n", "dead", "/run/netns/dead", after),
		at("n", "deleted", "/run/netns/deleted", after),
		at("n", "legacy", "/run/netns/legacy", before),
		at("n", "legacygone", "/run/netns/dead", before),
		at("n", "legacydel", "/run/netns/legacydel", before),
		at("new", "moved", "/run/netns/moved", after),
	}
	ad := newAdmission(records, epoch, atts, gone)

	for _, tt := range []struct {
		id, ip, reason string
	}{
		{"ok", "192.0.2.2", ""},
		{"readded", "192.0.2.2", WithheldSuperseded}, // the entry says .2, the last ADD mapped .9
		{"dead", "192.0.2.3", WithheldGone},
		{"deleted", "192.0.2.6", WithheldDeleted}, // younger than the ledger, no record
		{"legacy", "192.0.2.7", ""},               // older than the ledger: an earlier plugin's
		{"legacygone", "192.0.2.8", WithheldGone},
		{"legacydel", "192.0.2.8", WithheldDeleted},
	} {
		var a cnicache.Attachment
		for _, x := range atts {
			if x.ContainerID == tt.id {
				a = x
			}
		}
		if reason, why := ad.withhold(a, plans(tt.ip)); reason != tt.reason || (reason != "") != (why != "") {
			t.Errorf("withhold %s: %q (%s), want %q", tt.id, reason, why, tt.reason)
		}
	}
	if reason, _ := newAdmission(nil, time.Time{}, atts, gone).withhold(atts[3], plans("192.0.2.6")); reason != "" {
		t.Errorf("with no ledger yet, an entry without record is withheld: %s", reason)
	}

	for _, tt := range []struct {
		network, id string
		held        bool
	}{
		{"n", "pending", true}, // ADD on record, not cached yet
		{"", "pending", true},  // an object that names no network
		{"other", "pending", false},
		{"n", "readded", true},  // cached, but its last ADD is newer
		{"n", "dead", false},    // namespace gone
		{"old", "moved", false}, // its eth0 is the runtime's on "new"
		{"n", "unknown", false}, // no record: the orphan rule decides
		{"n", "legacydel", false},
	} {
		if got := ad.hold(tt.network, tt.id) != ""; got != tt.held {
			t.Errorf("hold %s/%s: %t, want %t", tt.network, tt.id, got, tt.held)
		}
	}

	// An owner withheld as deleted: its objects are its DEL's to remove,
	// never a pass's.
	rep := &Report{}
	if ws := ad.admit([]*wanted{{att: atts[3], Attachment: &attach.Attachment{Plans: plans("192.0.2.6")}}, {att: atts[0], Attachment: &attach.Attachment{Plans: plans("192.0.2.2")}}}, rep); len(ws) != 1 || len(rep.Withheld) != 1 {
		t.Fatalf("admit: kept %d, withheld %+v", len(ws), rep.Withheld)
	}
	for _, network := range []string{"n", ""} {
		if ad.hold(network, "deleted") == "" {
			t.Errorf("hold %q/deleted after it was withheld as deleted: no, want its objects kept", network)
		}
	}

	stale := map[plan.Owner]bool{}
	for _, o := range ad.stale() {
		stale[o] = true
	}
	// Forgotten: the Del record of an entry gone from the cache, the Add
	// record of an uncached owner whose namespace is gone. Kept: the
	// rest (legacydel is still cached; moved's namespace lives).
	delete(records, owner("n", "legacydel"))
	if len(stale) != 0 {
		t.Errorf("stale %v, want none", stale)
	}
	records[owner("n", "gonedel")] = ledger.New(owner("n", "gonedel"), ledger.Del)
	records[owner("n", "crashed")] = add(owner("n", "crashed"), "/run/netns/dead", "192.0.2.10")
	got := map[plan.Owner]bool{}
	for _, o := range newAdmission(records, epoch, atts, gone).stale() {
		got[o] = true
	}
	if len(got) != 2 || !got[owner("n", "gonedel")] || !got[owner("n", "crashed")] {
		t.Errorf("stale %v, want gonedel's and crashed's records", got)
	}
}

// A withheld attachment is logged and counted once while it stays, and
// again if it comes back after a pass without it.
func TestLogHeldOnce(t *testing.T) {
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var withheld, kept map[string]bool
	r := &Report{Withheld: []Withheld{{Network: "n", ContainerID: "c1", IfName: "eth0", File: "f1", Reason: WithheldDeleted, Why: "w"}},
		Kept: []Orphan{{Network: "n", ContainerID: "c2", Backend: "nftables", Family: "ipv4", Object: "chain dn-x", State: "kept", Error: "e"}}}
	counts := []map[string]int{}
	for _, rep := range []*Report{r, r, {}, r} {
		counts = append(counts, logHeld(log, rep, &withheld, &kept))
	}
	want := []int{1, 0, 0, 1}
	for i, c := range counts {
		if c[WithheldDeleted] != want[i] {
			t.Errorf("pass %d counted %v, want %d deleted", i, c, want[i])
		}
	}
	if n := strings.Count(buf.String(), `msg="attachment withheld"`); n != 2 {
		t.Errorf("logged %d withheld records, want 2:\n%s", n, buf.String())
	}
	if n := strings.Count(buf.String(), "msg=kept"); n != 2 {
		t.Errorf("logged %d kept records, want 2:\n%s", n, buf.String())
	}
}
