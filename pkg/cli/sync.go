package cli

import (
	"flag"
	"fmt"
	"log/slog"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/sdnotify"
)

// networks is the repeatable --network flag.
type networks []string

func (n *networks) String() string     { return strings.Join(*n, ",") }
func (n *networks) Set(v string) error { *n = append(*n, v); return nil }

// syncMain is `portmap sync`: it parses args, chroots with --root, runs
// one pass and prints its report (or, with --watch, runs the agent until
// SIGTERM). It returns the exit status: 0 when everything is right or was
// repaired, 1 when anything could not be, 2 for bad usage.
func (p Program) syncMain(args []string) int {
	fs := p.newFlags("sync", "[--cache-dir DIR] [--network NAME]... [--prune] [--bpf-pin-dir DIR]... [--dry-run] [--json]\n--watch [--interval 60s] [--metrics-addr HOST:PORT] [--log-format json] [--cache-dir DIR] [--network NAME]... [--prune]",
		"Bring every cached attachment's host ports back to what the runtime made, in\n"+
			"every backend and layer, both families: one pass, or with --watch the node\n"+
			"agent (a pass after every firewall change and every --interval).")
	var o agent.Options
	var nets networks
	fs.StringVar(&o.CacheDir, "cache-dir", cnicache.DefaultDir, "libcni's cache directory (its results/ lists the attachments)")
	fs.Var(&nets, "network", "sync only this network (repeatable)")
	var pinDirs networks
	fs.Var(&pinDirs, "bpf-pin-dir", "also visit the socket path pinned here (a \"bpfPinDir\" no cached attachment names any more; repeatable)")
	fs.BoolVar(&o.Prune, "prune", false, "remove host-port mappings whose owner has no cache entry; without --watch, also the socket path's programs and pins once no entry remains")
	fs.BoolVar(&o.DryRun, "dry-run", false, "change nothing; report what a pass would do")
	fs.BoolVar(&o.JSON, "json", false, "print the report as JSON")
	watch := fs.Bool("watch", false, "keep running: a pass after every firewall change (nf_tables events) and every --interval")
	interval := fs.Duration("interval", 60*time.Second, "with --watch: time between passes without events")
	debounce := fs.Duration("debounce", 200*time.Millisecond, "with --watch: quiet time after events before a pass")
	minPeriod := fs.Duration("min-sync-period", time.Second, "with --watch: least time from one pass's start to the next that firewall changes trigger (a busy runtime changes it many times a second)")
	metricsAddr := fs.String("metrics-addr", "", "with --watch, in portmap-agent: serve /metrics, /healthz and /readyz on HOST:PORT (port 0 picks one; the log names it); off when empty")
	logFormat := fs.String("log-format", "text", "with --watch: the log's format, text or json (one object a line)")
	root := fs.String("root", "", "chroot into this directory first: in a container with the host's / mounted there, use the host's own iptables, nft, cache and lock")
	if code, done := p.parse(fs, args); done {
		return code
	}
	o.Networks = nets
	o.Retire = o.Prune && !*watch
	for _, d := range pinDirs {
		req, err := pinDirSite(d)
		if err != nil {
			fmt.Fprintln(p.Stderr, p.Name+" sync:", err)
			return 2
		}
		o.Sites = append(o.Sites, req)
	}
	if *watch && (o.DryRun || o.JSON) {
		fmt.Fprintln(p.Stderr, p.Name+" sync: --watch cannot be combined with --dry-run or --json")
		return 2
	}
	if !*watch {
		var watchOnly []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "metrics-addr" || f.Name == "log-format" || f.Name == "interval" || f.Name == "debounce" || f.Name == "min-sync-period" {
				watchOnly = append(watchOnly, "--"+f.Name)
			}
		})
		if len(watchOnly) > 0 {
			fmt.Fprintf(p.Stderr, p.Name+" sync: %s only with --watch\n", strings.Join(watchOnly, ", "))
			return 2
		}
	}
	if *metricsAddr != "" && p.Metrics == nil {
		fmt.Fprintf(p.Stderr, "%s sync: --metrics-addr needs portmap-agent, the same commands with /metrics, /healthz and /readyz "+
			"(the plugin binary links no HTTP server: it would slow every CNI call)\n", p.Name)
		return 2
	}
	if *logFormat != "text" && *logFormat != "json" {
		fmt.Fprintf(p.Stderr, p.Name+" sync: --log-format %q: want text or json\n", *logFormat)
		return 2
	}
	if *watch && (*interval <= 0 || *debounce < 0 || *minPeriod < 0) {
		fmt.Fprintln(p.Stderr, p.Name+" sync: --interval must be positive, --debounce and --min-sync-period not negative")
		return 2
	}
	if *root != "" {
		if err := p.Chroot(*root); err != nil {
			fmt.Fprintln(p.Stderr, p.Name+" sync:", err)
			return 1
		}
	}
	// After the chroot: the host handle finds the host's own tools.
	a := &agent.Agent{Host: p.Host(p.Stderr)}
	if *watch {
		return p.runWatch(a, agent.WatchOptions{Options: o, Interval: *interval, Debounce: *debounce, MinPeriod: *minPeriod}, *metricsAddr, *logFormat)
	}
	rep, err := a.Sync(o)
	if rep != nil {
		if werr := rep.Write(p.Stdout, o.JSON); werr != nil {
			fmt.Fprintln(p.Stderr, p.Name+" sync:", werr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintln(p.Stderr, p.Name+" sync:", err)
		return 1
	}
	if rep.Failed() {
		return 1
	}
	return 0
}

// pinDirSite is the socket path's site pinned at dir (--bpf-pin-dir).
func pinDirSite(dir string) (*plan.Request, error) {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return nil, fmt.Errorf("--bpf-pin-dir %q: want a clean absolute path", dir)
	}
	req := &plan.Request{Socket: plan.Socket{PinDir: dir}}
	backend.Canon(req) // the default site is visited anyway
	return req, nil
}

// runWatch runs the agent until SIGTERM or SIGINT, logging to stdout in
// format (text or json); with metricsAddr it serves the metrics and
// probes there; under systemd (NOTIFY_SOCKET) it says when it is ready
// and feeds the watchdog.
func (p Program) runWatch(a *agent.Agent, o agent.WatchOptions, metricsAddr, format string) int {
	var h slog.Handler = slog.NewTextHandler(p.Stdout, nil)
	if format == "json" {
		h = slog.NewJSONHandler(p.Stdout, nil)
	}
	log := slog.New(h)
	ctx, stop := signal.NotifyContext(p.Context, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if metricsAddr != "" {
		obs := p.Metrics(o.Interval)
		o.Observe, o.OnEvent = obs.Pass, obs.Event
		addr, err := obs.Serve(ctx, metricsAddr, log)
		if err != nil {
			log.Error("cannot serve metrics", "addr", metricsAddr, "err", err)
			return 1
		}
		log.Info("serving /metrics, /healthz and /readyz", "addr", addr.String())
	}
	if n := sdnotify.FromEnv(); n != nil {
		o.Watchdog = sdnotify.WatchdogInterval()
		o.Notify = func(state string) {
			if err := n.Notify(state); err != nil {
				log.Warn("systemd notification failed", "state", state, "err", err)
			}
		}
	}
	var events <-chan struct{}
	var drain func()
	sub, err := p.Events()
	if err != nil {
		// iptables-legacy hosts may lack nf_tables: the timer still works.
		log.Warn("no nf_tables events; passes on the interval only", "err", err, "interval", o.Interval.String())
	} else {
		defer sub.Close()
		events, drain = sub.C, sub.Drain
	}
	if err := a.Watch(ctx, o, events, drain, log); err != nil {
		log.Error("watch ended", "err", err)
		return 1
	}
	return 0
}
