package cli

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/cmdline"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/firewalld"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// networks is the repeatable --network flag.
type networks []string

func (n *networks) String() string     { return strings.Join(*n, ",") }
func (n *networks) Set(v string) error { *n = append(*n, v); return nil }

// syncMain is `portmap-agent sync`: it parses args, chroots with --root, runs
// one pass and prints its report (or, with --watch, runs the agent until
// SIGTERM). It returns the exit status: 0 when everything is right or was
// repaired, 1 when anything could not be, 2 for bad usage.
func (a Agent) syncMain(p cmdline.Program, args []string) int {
	fs := p.Flags("sync", "[--cache-dir DIR] [--network NAME]... [--prune] [--bpf-pin-dir DIR]... [--dry-run] [--json]\n--watch [--interval 60s] [--metrics-addr HOST:PORT] [--log-format json] [--cache-dir DIR] [--network NAME]... [--prune]",
		"Bring every cached attachment's host ports back to what the runtime made, in\n"+
			"every backend and layer, both families: one pass, or with --watch the node\n"+
			"agent (a pass after every firewall change and every --interval).")
	f := syncFlags(fs)
	if code, done := p.Parse(fs, args); done {
		return code
	}
	if err := a.checkSync(fs, f); err != nil {
		fmt.Fprintln(p.Stderr, p.Name+" sync:", err)
		return 2
	}
	if f.root != "" {
		if err := a.Chroot(f.root); err != nil {
			fmt.Fprintln(p.Stderr, p.Name+" sync:", err)
			return 1
		}
	}
	// After the chroot: the host handle finds the host's own tools.
	ag := &agent.Agent{Host: a.Host(p.Stderr)}
	if f.watch {
		return a.runWatch(p, ag, f.WatchOptions, f.metricsAddr, f.logFormat)
	}
	rep, err := ag.Sync(f.Options)
	if rep != nil {
		if werr := rep.Write(p.Stdout, f.JSON); werr != nil {
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

// syncArgs are the flags of `portmap-agent sync`.
type syncArgs struct {
	agent.WatchOptions
	nets, pinDirs          networks
	watch                  bool
	metricsAddr, logFormat string
	root                   string
}

// syncFlags defines the flags of `portmap-agent sync` in fs.
func syncFlags(fs *flag.FlagSet) *syncArgs {
	f := &syncArgs{}
	fs.StringVar(&f.CacheDir, "cache-dir", cnicache.DefaultDir, "libcni's cache directory (its results/ lists the attachments)")
	fs.Var(&f.nets, "network", "sync only this network (repeatable)")
	fs.Var(&f.pinDirs, "bpf-pin-dir", "also visit the socket path pinned here (a \"bpfPinDir\" no cached attachment names any more; repeatable)")
	fs.BoolVar(&f.Prune, "prune", false, "remove host-port mappings whose owner has no cache entry; without --watch, also the socket path's programs and pins once no entry remains")
	fs.BoolVar(&f.DryRun, "dry-run", false, "change nothing; report what a pass would do")
	fs.BoolVar(&f.JSON, "json", false, "print the report as JSON")
	fs.BoolVar(&f.watch, "watch", false, "keep running: a pass after every firewall change (nf_tables events) and every --interval")
	fs.DurationVar(&f.Interval, "interval", 60*time.Second, "with --watch: time between passes without events")
	fs.DurationVar(&f.Debounce, "debounce", 200*time.Millisecond, "with --watch: quiet time after events before a pass")
	fs.DurationVar(&f.MinPeriod, "min-sync-period", time.Second, "with --watch: least time from one pass's start to the next that firewall changes trigger (a busy runtime changes it many times a second)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "with --watch: serve /metrics, /healthz and /readyz on HOST:PORT (port 0 picks one; the log names it); off when empty")
	fs.StringVar(&f.logFormat, "log-format", "text", "with --watch: the log's format, text or json (one object a line)")
	fs.StringVar(&f.root, "root", "", "chroot into this directory first: in a container with the host's / mounted there, use the host's own iptables, nft, cache and lock")
	return f
}

// checkSync completes the options from the flags of fs and says what of
// them is bad usage.
func (a Agent) checkSync(fs *flag.FlagSet, f *syncArgs) error {
	f.Networks = f.nets
	f.Retire = f.Prune && !f.watch
	for _, d := range f.pinDirs {
		req, err := pinDirSite(d)
		if err != nil {
			return err
		}
		f.Sites = append(f.Sites, req)
	}
	var watchOnly []string
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "metrics-addr", "log-format", "interval", "debounce", "min-sync-period":
			watchOnly = append(watchOnly, "--"+fl.Name)
		}
	})
	switch {
	case f.watch && (f.DryRun || f.JSON):
		return errors.New("--watch cannot be combined with --dry-run or --json")
	case !f.watch && len(watchOnly) > 0:
		return fmt.Errorf("%s only with --watch", strings.Join(watchOnly, ", "))
	case f.metricsAddr != "" && a.Metrics == nil:
		return errors.New("--metrics-addr: this build serves no metrics")
	case f.logFormat != "text" && f.logFormat != "json":
		return fmt.Errorf("--log-format %q: want text or json", f.logFormat)
	case f.watch && (f.Interval <= 0 || f.Debounce < 0 || f.MinPeriod < 0):
		return errors.New("--interval must be positive, --debounce and --min-sync-period not negative")
	}
	return nil
}

// pinDirSite is the socket path's site pinned at dir (--bpf-pin-dir).
func pinDirSite(dir string) (*plan.Request, error) {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return nil, fmt.Errorf("--bpf-pin-dir %q: want a clean absolute path", dir)
	}
	req := &plan.Request{Socket: plan.Socket{PinDir: dir}}
	backend.Normalize(req) // the default site is visited anyway
	return req, nil
}

// runWatch runs the agent until SIGTERM or SIGINT, logging to stdout in
// format (text or json); with metricsAddr it serves the metrics and
// probes there; under systemd (NOTIFY_SOCKET) it says when it is ready
// and feeds the watchdog.
func (a Agent) runWatch(p cmdline.Program, ag *agent.Agent, o agent.WatchOptions, metricsAddr, format string) int {
	var h slog.Handler = slog.NewTextHandler(p.Stdout, nil)
	if format == "json" {
		h = slog.NewJSONHandler(p.Stdout, nil)
	}
	log := slog.New(h)
	ctx, stop := signal.NotifyContext(a.Context, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if metricsAddr != "" {
		obs := a.Metrics(o.Interval)
		o.Observe, o.OnEvent, o.OnReload = obs.Pass, obs.Event, obs.Reload
		addr, err := obs.Serve(ctx, metricsAddr, log)
		if err != nil {
			log.Error("cannot serve metrics", "addr", metricsAddr, "err", err)
			return 1
		}
		log.Info("serving /metrics, /healthz and /readyz", "addr", addr.String())
	}
	if os.Getenv("NOTIFY_SOCKET") != "" {
		// WATCHDOG=1 twice in the watchdog's time, as sd_watchdog_enabled(3) advises
		if wd, err := daemon.SdWatchdogEnabled(false); err == nil {
			o.Watchdog = wd / 2
		}
		o.Notify = func(state string) {
			if _, err := daemon.SdNotify(false, state); err != nil {
				log.Warn("systemd notification failed", "state", state, "err", err)
			}
		}
	}
	var events <-chan struct{}
	var drain func()
	sub, err := a.Events()
	if err != nil {
		// iptables-legacy hosts may lack nf_tables: the timer still works.
		log.Warn("no nf_tables events; passes on the interval only", "err", err, "interval", o.Interval.String())
	} else {
		defer sub.Close()
		events, drain = sub.C, sub.Drain
	}
	// firewalld's bus is found in the background: a bus that is slow or
	// does not answer (firewalld.ConnectTimeout) holds no pass and not
	// the agent's readiness
	var bus struct {
		sync.Mutex
		b *firewalld.Bus
	}
	o.ConnectFirewall = func() (agent.Firewall, error) {
		b, err := firewalld.Connect()
		if err != nil {
			return nil, err
		}
		bus.Lock()
		defer bus.Unlock()
		bus.b = b
		return b, nil
	}
	defer func() {
		bus.Lock()
		defer bus.Unlock()
		if bus.b != nil {
			bus.b.Close()
		}
	}()
	if err := ag.Watch(ctx, o, events, drain, log); err != nil {
		log.Error("watch ended", "err", err)
		return 1
	}
	return 0
}
