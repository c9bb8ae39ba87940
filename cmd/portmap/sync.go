package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/backend/socket"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/nfevents"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// networks is the repeatable --network flag.
type networks []string

func (n *networks) String() string     { return strings.Join(*n, ",") }
func (n *networks) Set(v string) error { *n = append(*n, v); return nil }

// syncMain is `portmap sync`: it parses args, chroots with --root, runs
// one pass and prints its report (or, with --watch, runs the agent until
// SIGTERM). It returns the exit status: 0 when everything is right or was
// repaired, 1 when anything could not be, 2 for bad usage.
func syncMain(args []string) int {
	fs := newFlags("sync", "[--cache-dir DIR] [--network NAME]... [--prune] [--bpf-pin-dir DIR]... [--dry-run] [--json]\n       portmap sync --watch [--interval 60s] [--metrics-addr HOST:PORT] [--cache-dir DIR] [--network NAME]... [--prune]",
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
	root := fs.String("root", "", "chroot into this directory first: in a container with the host's / mounted there, use the host's own iptables, nft, cache and lock")
	if code, done := parse(fs, args); done {
		return code
	}
	o.Networks = nets
	o.Retire = o.Prune && !*watch
	for _, d := range pinDirs {
		req, err := pinDirSite(d)
		if err != nil {
			fmt.Fprintln(os.Stderr, "portmap sync:", err)
			return 2
		}
		o.Sites = append(o.Sites, req)
	}
	if *watch && (o.DryRun || o.JSON) {
		fmt.Fprintln(os.Stderr, "portmap sync: --watch cannot be combined with --dry-run or --json")
		return 2
	}
	if *watch && (*interval <= 0 || *debounce < 0) {
		fmt.Fprintln(os.Stderr, "portmap sync: --interval must be positive and --debounce not negative")
		return 2
	}
	if *root != "" {
		if err := syscall.Chroot(*root); err != nil {
			fmt.Fprintf(os.Stderr, "portmap sync: chroot %s: %v\n", *root, err)
			return 1
		}
		if err := os.Chdir("/"); err != nil {
			fmt.Fprintf(os.Stderr, "portmap sync: %v\n", err)
			return 1
		}
	}
	// After the chroot: the host handle finds the host's own tools.
	a := &agent.Agent{Host: host.Real(os.Stderr)}
	if *watch {
		return runWatch(a, agent.WatchOptions{Options: o, Interval: *interval, Debounce: *debounce})
	}
	rep, err := a.Sync(o)
	if rep != nil {
		if werr := rep.Write(os.Stdout, o.JSON); werr != nil {
			fmt.Fprintln(os.Stderr, "portmap sync:", werr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "portmap sync:", err)
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
	if dir == socket.DefaultPinDir {
		dir = "" // the default site, visited anyway
	}
	return &plan.Request{Socket: plan.Socket{PinDir: dir}}, nil
}

// runWatch runs the agent until SIGTERM or SIGINT, logging to stdout.
func runWatch(a *agent.Agent, o agent.WatchOptions) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var events <-chan struct{}
	var drain func()
	sub, err := nfevents.Subscribe()
	if err != nil {
		// iptables-legacy hosts may lack nf_tables: the timer still works.
		fmt.Fprintf(os.Stderr, "portmap sync --watch: %v; passes every %s only\n", err, o.Interval)
	} else {
		defer sub.Close()
		events, drain = sub.C, sub.Drain
	}
	if err := a.Watch(ctx, o, events, drain, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "portmap sync --watch:", err)
		return 1
	}
	return 0
}
