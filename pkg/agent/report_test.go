package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/test/fixture"
)

// fullReport holds a line of every kind.
func fullReport(dryRun bool) *Report {
	return &Report{DryRun: dryRun,
		Attachments: []Attachment{
			{Network: "net1", ContainerID: "c1", IfName: "eth0", Backend: "nftables", State: "ok", File: "/var/lib/cni/results/net1-c1-eth0"},
			{Network: "net1", ContainerID: "c2", IfName: "eth0", Backend: "iptables", State: "repaired", What: "ipv4: chain CNI-DN-x missing"},
			{Network: "net1", ContainerID: "c3", IfName: "eth0", Backend: "iptables", State: "error", What: "ipv4: restore: line 3 failed"},
		},
		Shared:  []Shared{{Backend: "nftables", Family: "ipv4", What: "map cni-portmap-dnat missing"}},
		Removed: []Shared{{Backend: "localhost", Family: "ipv4", What: "socket path: no entry left"}},
		Orphans: []Orphan{
			{Network: "net1", ContainerID: "gone", Backend: "nftables", Family: "ipv4", Object: "chain dn-x", State: "orphan"},
			{Network: "?", ContainerID: "old", Backend: "iptables", Family: "ipv6", Object: "chain CNI-DN-y", State: "pruned"},
			{Network: "net2", ContainerID: "bad", Backend: "iptables", Family: "ipv4", Object: "chain CNI-DN-z", State: "error", Error: "busy"},
		},
		Withheld: []Withheld{{Network: "net1", ContainerID: "c4", IfName: "eth0", File: "f", Reason: WithheldDeleted, Why: "DEL began"}},
		Kept:     []Orphan{{Network: "net1", ContainerID: "c5", Backend: "nftables", Family: "ipv4", Object: "chain dn-k", Error: "ADD in flight"}},
		Skipped: []Skipped{
			{File: "/var/lib/cni/results/other-c6-eth0", Why: "network without portmap"},
			{File: "/var/lib/cni/results/net1-c7-eth0", Why: "corrupt: unexpected end of JSON input", Error: true},
		},
		Summary: Summary{Attachments: 3, OK: 1, Repaired: 1, Errors: 1, Orphans: 3, Pruned: 1, Skipped: 2, Withheld: 1, Kept: 1, NoMappings: 4},
	}
}

// The text report, a line of every kind, as a pass prints it and as a
// dry run does.
func TestReportText(t *testing.T) {
	var b bytes.Buffer
	for _, dry := range []bool{false, true} {
		if err := fullReport(dry).Write(&b, false); err != nil {
			t.Fatal(err)
		}
	}
	fixture.Golden(t, "testdata/report.golden", b.String())
	if !fullReport(false).Failed() || (&Report{Orphans: []Orphan{{State: "error"}}}).Failed() != true || (&Report{}).Failed() {
		t.Error("Failed: an error result or a failed prune fails the pass, nothing else")
	}
}

// The watcher's log: one record per change, orphans that are only
// listed and unusable cache files once, the summary; nothing for a pass
// that found everything right.
func TestLogChanges(t *testing.T) {
	var b bytes.Buffer
	// records without their time, for the golden file
	noTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	log := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{ReplaceAttr: noTime}))
	logged := map[string]bool{}
	logChanges(log, fullReport(false), TriggerEvent, 12*time.Millisecond, logged)
	first := b.String()
	b.Reset()
	logChanges(log, fullReport(false), TriggerInterval, time.Millisecond, logged)
	second := b.String()
	b.Reset()
	logChanges(log, &Report{Attachments: []Attachment{{State: "ok"}}, Summary: Summary{Attachments: 1, OK: 1}}, TriggerInterval, 0, logged)
	fixture.Golden(t, "testdata/log.golden", first+"--- the next pass\n"+second)
	if b.Len() != 0 {
		t.Errorf("a pass with everything right logged:\n%s", b.String())
	}
	if strings.Contains(second, "container=gone") || strings.Contains(second, "net1-c7-eth0") || !strings.Contains(second, "container=bad") {
		t.Errorf("the second pass logs a listed orphan or a skipped file again, or not a failed prune:\n%s", second)
	}
}
