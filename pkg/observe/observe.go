// Package observe is what the node agent (`portmap-agent sync --watch`) tells
// operators over HTTP: /metrics in the Prometheus text format, /healthz
// with kube-proxy's meaning (200 while the last pass succeeded within two
// intervals, else 503 with the reason) and /readyz (200 once a pass has
// succeeded). It learns of the agent's passes and events through
// agent.WatchOptions' Observe and OnEvent.
package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/buildinfo"
)

// Agent keeps what the watcher's passes said: metrics and health.
type Agent struct {
	interval time.Duration
	now      func() time.Time
	reg      *prometheus.Registry
	m        metrics

	mu      sync.Mutex
	started time.Time
	last    *agent.PassInfo // the last pass, nil before the first ends
	lastEnd time.Time
	lastOK  time.Time // end of the last successful pass
}

type metrics struct {
	passes      *prometheus.CounterVec
	duration    prometheus.Histogram
	repairs     *prometheus.CounterVec
	errors      *prometheus.CounterVec
	attachments prometheus.Gauge
	orphans     prometheus.Gauge
	pruned      prometheus.Counter
	corrupt     prometheus.Gauge
	notRun      prometheus.Gauge
	events      prometheus.Counter
	reloads     prometheus.Counter
	withheld    *prometheus.CounterVec
	lastSuccess prometheus.Gauge
}

// New returns the observer of a watcher passing every interval; now is
// the clock (nil: time.Now).
func New(interval time.Duration, now func() time.Time) *Agent {
	if now == nil {
		now = time.Now
	}
	a := &Agent{interval: interval, now: now, reg: prometheus.NewRegistry(), started: now()}
	f := func(c prometheus.Collector) { a.reg.MustRegister(c) }
	const ns = "portmap_agent"
	a.m = metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "passes_total",
			Help: "Passes of the watcher, by what triggered them: start, event (a firewall change, or the pass confirming a pass that wrote), interval, reload (firewalld's Reloaded signal, or its start)."}, []string{"trigger"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "pass_duration_seconds",
			Help: "How long a pass took.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "repairs_total",
			Help: "What passes repaired, by kind: attachment (an attachment's objects), shared (a shared chain, rule, table or hook)."}, []string{"kind"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "errors_total",
			Help: "Errors, by kind: pass (a pass that did not complete), attachment (one that could not be repaired), orphan (one that could not be pruned)."}, []string{"kind"}),
		attachments: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "attachments",
			Help: "Cached attachments with port mappings the last pass saw."}),
		orphans: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "orphans",
			Help: "Host-port objects without a cache entry the last pass found (pruned or not)."}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "orphans_pruned_total",
			Help: "Orphans removed (--prune)."}),
		corrupt: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "cache_entries_corrupt",
			Help: "Cache entries the last pass skipped as unusable (corrupt, or an invalid portmap configuration)."}),
		notRun: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "units_not_run",
			Help: "Units (a backend or layer of one family) the last pass skipped because the agent lacks a capability they need (the socket path without CAP_BPF): a warning, /healthz passes."}),
		withheld: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "withheld_total",
			Help: "Cached attachments a pass wrote nothing for, counted once each, by reason: deleted (the pass read the cache before their DEL began, or the runtime left the entry behind after DEL), gone (their network namespace no longer exists), superseded (the cache entry predates their last ADD)."}, []string{"reason"}),
		events: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "nftables_events_total",
			Help: "nf_tables change events received."}),
		reloads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "firewalld_reloads_total",
			Help: "firewalld reloads and starts seen on the system bus (its Reloaded signal; its taking its bus name)."}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "last_success_timestamp_seconds",
			Help: "When the last successful pass ended (Unix time)."}),
	}
	for _, c := range []prometheus.Collector{a.m.passes, a.m.duration, a.m.repairs, a.m.errors, a.m.attachments,
		a.m.orphans, a.m.pruned, a.m.corrupt, a.m.notRun, a.m.events, a.m.reloads, a.m.lastSuccess, a.m.withheld} {
		f(c)
	}
	for _, t := range []string{agent.TriggerStart, agent.TriggerEvent, agent.TriggerInterval, agent.TriggerReload} {
		a.m.passes.WithLabelValues(t)
	}
	for _, k := range []string{"attachment", "shared"} {
		a.m.repairs.WithLabelValues(k)
	}
	for _, k := range []string{"pass", "attachment", "orphan"} {
		a.m.errors.WithLabelValues(k)
	}
	for _, k := range []string{agent.WithheldDeleted, agent.WithheldGone, agent.WithheldSuperseded} {
		a.m.withheld.WithLabelValues(k)
	}
	in := buildinfo.Get()
	bi := prometheus.NewGauge(prometheus.GaugeOpts{Name: "portmap_build_info", Help: "The running build (value 1).",
		ConstLabels: prometheus.Labels{"version": in.Version, "revision": in.Revision, "goversion": in.Go}})
	bi.Set(1)
	f(bi)
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return a
}

// Pass takes in one pass (agent.WatchOptions.Observe).
func (a *Agent) Pass(p agent.PassInfo) {
	a.m.passes.WithLabelValues(p.Trigger).Inc()
	a.m.duration.Observe(p.Took.Seconds())
	for reason, n := range p.NewlyWithheld {
		a.m.withheld.WithLabelValues(reason).Add(float64(n))
	}
	if r := p.Report; r != nil {
		a.m.repairs.WithLabelValues("attachment").Add(float64(r.Summary.Repaired))
		a.m.repairs.WithLabelValues("shared").Add(float64(len(r.Shared)))
		a.m.errors.WithLabelValues("attachment").Add(float64(r.Summary.Errors))
		orphanErrors, corrupt := 0, 0
		for _, o := range r.Orphans {
			if o.State == "error" {
				orphanErrors++
			}
		}
		for _, s := range r.Skipped {
			if s.Error {
				corrupt++
			}
		}
		a.m.errors.WithLabelValues("orphan").Add(float64(orphanErrors))
		a.m.attachments.Set(float64(r.Summary.Attachments))
		a.m.orphans.Set(float64(r.Summary.Orphans))
		a.m.pruned.Add(float64(r.Summary.Pruned))
		a.m.corrupt.Set(float64(corrupt))
		a.m.notRun.Set(float64(len(r.NotRun)))
	}
	end := p.Start.Add(p.Took)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.last, a.lastEnd = &p, end
	if p.Err != nil {
		a.m.errors.WithLabelValues("pass").Inc()
		return
	}
	a.lastOK = end
	a.m.lastSuccess.Set(float64(end.UnixNano()) / 1e9)
}

// Event counts one nf_tables event (agent.WatchOptions.OnEvent).
func (a *Agent) Event() { a.m.events.Inc() }

// Reload counts one firewalld reload (agent.WatchOptions.OnReload).
func (a *Agent) Reload() { a.m.reloads.Inc() }

// Health is /healthz: true while the last pass succeeded and ended within
// two intervals (and, before the first pass ends, for two intervals after
// the start); the text says why.
func (a *Agent) Health() (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now, limit := a.now(), 2*a.interval
	if a.last == nil {
		if d := now.Sub(a.started); d > limit {
			return false, fmt.Sprintf("no pass has ended in the %s since the start (limit 2 × interval = %s)", round(d), limit)
		}
		return true, "starting: the first pass is running"
	}
	ago := now.Sub(a.lastEnd)
	if a.last.Err != nil {
		return false, fmt.Sprintf("the last pass (%s, %s ago) failed: %v", a.last.Trigger, round(ago), a.last.Err)
	}
	if ago > limit {
		return false, fmt.Sprintf("no pass has ended for %s (limit 2 × interval = %s): the loop is stuck", round(ago), limit)
	}
	return true, fmt.Sprintf("ok: the last pass (%s) succeeded %s ago", a.last.Trigger, round(ago))
}

// Ready is /readyz: true once a pass has succeeded.
func (a *Agent) Ready() (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lastOK.IsZero() {
		return false, "no pass has succeeded yet"
	}
	return true, "ready: a pass has succeeded"
}

func round(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// Handler serves /metrics, /healthz and /readyz.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	probe := func(check func() (bool, string)) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			ok, why := check()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if !ok {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			fmt.Fprintln(w, why)
		}
	}
	mux.Handle("GET /healthz", probe(a.Health))
	mux.Handle("GET /readyz", probe(a.Ready))
	return mux
}

// Serve listens on addr (HOST:PORT; port 0 picks one) and serves h until
// ctx ends; it returns the bound address once listening.
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr(), nil
}

// Serve serves a's Handler on addr until ctx ends (cli.Observer).
func (a *Agent) Serve(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	return Serve(ctx, addr, a.Handler(), log)
}
