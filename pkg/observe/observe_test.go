package observe

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/agent"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

// TestHealthAndReadiness walks the probes through a watcher's life on a
// fake clock (interval 10 s, so the limit is 20 s).
func TestHealthAndReadiness(t *testing.T) {
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	a := New(10*time.Second, func() time.Time { return now })
	h := a.Handler()
	pass := func(trigger string, err error) {
		a.Pass(agent.PassInfo{Trigger: trigger, Start: now, Took: 0, Report: &agent.Report{}, Err: err})
	}
	for _, step := range []struct {
		name    string
		do      func()
		healthz int
		why     string
		readyz  int
	}{
		{"starting", func() {}, 200, "starting", 503},
		{"first pass still running after 2 intervals", func() { now = now.Add(21 * time.Second) }, 503, "no pass has ended in the 21s since the start", 503},
		{"first pass failed", func() { pass(agent.TriggerStart, errors.New("read cache: boom")) }, 503, "the last pass (start, 0s ago) failed: read cache: boom", 503},
		{"a pass succeeded", func() { now = now.Add(time.Second); pass(agent.TriggerInterval, nil) }, 200, "ok: the last pass (interval) succeeded 0s ago", 200},
		{"within 2 intervals", func() { now = now.Add(20 * time.Second) }, 200, "ok", 200},
		{"stuck past 2 intervals", func() { now = now.Add(time.Second) }, 503, "no pass has ended for 21s (limit 2 × interval = 20s): the loop is stuck", 200},
		{"failed again: ready stays", func() { pass(agent.TriggerEvent, errors.New("nope")) }, 503, "failed: nope", 200},
		{"recovered", func() { pass(agent.TriggerEvent, nil) }, 200, "ok", 200},
	} {
		step.do()
		code, body := get(t, h, "/healthz")
		if code != step.healthz || !strings.Contains(body, step.why) {
			t.Errorf("%s: /healthz %d %q, want %d and %q", step.name, code, body, step.healthz, step.why)
		}
		if code, body := get(t, h, "/readyz"); code != step.readyz {
			t.Errorf("%s: /readyz %d %q, want %d", step.name, code, body, step.readyz)
		}
	}
}

// TestMetricsCount: what the passes and events said shows in /metrics.
func TestMetricsCount(t *testing.T) {
	a := New(time.Minute, nil)
	a.Event()
	a.Event()
	start := time.Unix(1_800_000_000, 0)
	rep := &agent.Report{
		Shared:  []agent.Shared{{Backend: "nftables", Family: "ipv4", What: "table missing"}},
		Orphans: []agent.Orphan{{State: "pruned"}, {State: "error"}},
		Skipped: []agent.Skipped{{File: "x", Error: true}, {File: "y"}},
		NotRun:  []agent.Shared{{Backend: "localhost", Family: "ipv4", What: "lacks CAP_BPF"}},
		Summary: agent.Summary{Attachments: 3, OK: 1, Repaired: 1, Errors: 1, Orphans: 2, Pruned: 1},
	}
	a.Pass(agent.PassInfo{Trigger: agent.TriggerEvent, Start: start, Took: 50 * time.Millisecond, Report: rep})
	a.Pass(agent.PassInfo{Trigger: agent.TriggerInterval, Start: start.Add(time.Minute), Err: errors.New("x")})
	_, body := get(t, a.Handler(), "/metrics")
	for _, want := range []string{
		`portmap_agent_passes_total{trigger="event"} 1`,
		`portmap_agent_passes_total{trigger="interval"} 1`,
		`portmap_agent_passes_total{trigger="start"} 0`,
		`portmap_agent_pass_duration_seconds_count 2`,
		`portmap_agent_repairs_total{kind="attachment"} 1`,
		`portmap_agent_repairs_total{kind="shared"} 1`,
		`portmap_agent_errors_total{kind="attachment"} 1`,
		`portmap_agent_errors_total{kind="orphan"} 1`,
		`portmap_agent_errors_total{kind="pass"} 1`,
		`portmap_agent_attachments 3`,
		`portmap_agent_orphans 2`,
		`portmap_agent_orphans_pruned_total 1`,
		`portmap_agent_cache_entries_corrupt 1`,
		`portmap_agent_units_not_run 1`,
		`portmap_agent_nftables_events_total 2`,
		`portmap_agent_last_success_timestamp_seconds 1.80000000005e+09`,
		`portmap_build_info{goversion="go1.`,
		`process_resident_memory_bytes `,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}
