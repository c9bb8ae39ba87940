package agent

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/deadline"
)

// WatchOptions are the flags of `portmap-agent sync --watch`.
type WatchOptions struct {
	Options
	// Interval is the time between passes without an event (iptables-legacy
	// raises none).
	Interval time.Duration
	// Debounce is how long events must be quiet before a pass: a reload
	// commits many changes in a row.
	Debounce time.Duration
	// MinPeriod is the least time from the start of one pass to the start
	// of the next that events trigger (kube-proxy's --min-sync-period):
	// beside a busy runtime, whose every ADD and DEL changes the firewall,
	// passes do not follow each other back to back.
	MinPeriod time.Duration
	// Observe, when set, is told of every pass when it ends (metrics,
	// health).
	Observe func(PassInfo)
	// OnEvent, when set, is told of every nf_tables event received.
	OnEvent func()
	// Notify, when set, gets the service manager's states (systemd's
	// sd_notify): "READY=1" after the first pass, "WATCHDOG=1" every
	// Watchdog while no pass runs or the pass that runs is within
	// passBound (it may wait out a firewalld reload, then the host lock)
	// — a pass stuck past that gets none — and "STOPPING=1" at the end.
	// Notify may be called from two goroutines at once.
	Notify   func(state string)
	Watchdog time.Duration
	// Firewall, when set, is the node's firewall manager (firewalld on
	// the system bus), whose reloads flush the rules the agent repairs:
	// every pass waits until no reload is under way, and a pass follows
	// each reload it reports.
	Firewall Firewall
	// ConnectFirewall, when set and Firewall is not, finds the firewall
	// manager in the background as the watch starts (firewalld's bus,
	// which may be slow or not answer): passes neither wait for it nor
	// hold readiness; once it answers, it is Firewall from then on.
	ConnectFirewall func() (Firewall, error)
	// OnReload, when set, is told of every reload (and start) Firewall
	// reports.
	OnReload func()
}

// Firewall is a firewall manager that says when it reloaded and waits
// out a reload under way.
type Firewall interface {
	// Reloaded receives what happened ("reloaded", "started") after
	// each reload and each start of the manager, both of which write its
	// rules anew; it is closed when the manager can no longer be
	// followed.
	Reloaded() <-chan string
	// Settle returns once no reload is under way, or after timeout with
	// an error.
	Settle(timeout time.Duration) error
	// StrictForwardPorts says whether the manager drops connections
	// other software DNATed to containers (firewalld's setting of that
	// name): it then drops the host ports of every attachment.
	StrictForwardPorts() (bool, error)
}

// settleTimeout bounds a pass's wait for a reload under way (firewalld's
// take a second or two).
const settleTimeout = 30 * time.Second

// passBound is the longest a pass that makes progress takes: it waits
// out a reload (settleTimeout), then runs within its deadline
// (deadline.Pass: the host lock, the tools, the work), and 10 s more for
// the work past its last wait (seconds at thousands of attachments). The
// watchdog is fed while a pass runs within it, and not after: that pass
// is stuck.
var passBound = settleTimeout + deadline.Pass + 10*time.Second

// The triggers of a pass.
const (
	TriggerStart    = "start"
	TriggerEvent    = "event"
	TriggerInterval = "interval"
	// TriggerReload is the pass after the firewall manager's reload or
	// start.
	TriggerReload = "reload"
)

// PassInfo is one pass of the watcher, as Observe is told of it.
type PassInfo struct {
	// Trigger is TriggerStart, TriggerEvent (a firewall change, or the
	// pass that confirms a pass that wrote) or TriggerInterval.
	Trigger string
	Start   time.Time
	Took    time.Duration
	// Report is what the pass found and did; nil when it could not run.
	Report *Report
	// Err is why the pass did not complete (the cache could not be read,
	// a backend could not be read or written); nil when it did.
	Err error
	// NewlyWithheld counts, by reason, the cached attachments this pass
	// withheld that the pass before it did not: each DEL a pass caught
	// in flight, each container found gone, counted once.
	NewlyWithheld map[string]int
}

// KeepParsed makes the agent's passes keep what they parsed of each
// cache file and parse only files that changed, as Watch's passes do,
// until the returned function is called.
func (a *Agent) KeepParsed() (stop func()) {
	a.parsed = &parsedCache{reader: &cnicache.Reader{PluginType: "portmap"}}
	return func() { a.parsed = nil }
}

// Watch syncs once, then again after the firewall changes (a token on
// events, debounced) and every Interval, until ctx ends; it returns nil
// then. It logs to log what a pass found wrong and did, and nothing for a
// pass that found everything right.
//
// It never spins: a pass reads the state after the events it answers, so
// events that came before it are dropped (drain); a pass that wrote raised
// events of its own, so one more pass follows it — and a pass with
// nothing to repair writes nothing and raises none. With Prune, an orphan
// is removed only when two passes in a row found it, so an ADD whose rules
// exist a moment before the runtime caches it is never pruned.
func (a *Agent) Watch(ctx context.Context, o WatchOptions, events <-chan struct{}, drain func(), log *slog.Logger) error {
	notify := func(state string) {
		if o.Notify != nil {
			o.Notify(state)
		}
	}
	defer a.KeepParsed()()
	w := &watcher{a: a, o: o, drain: drain, log: log, seen: map[string]bool{}, logged: map[string]bool{}}
	interval := time.NewTicker(o.Interval)
	defer interval.Stop()
	if o.Watchdog > 0 {
		stop, fed := make(chan struct{}), make(chan struct{})
		defer func() { close(stop); <-fed }()
		go func() { w.feedWatchdog(o.Watchdog, passBound, notify, stop); close(fed) }()
	}
	var settle <-chan time.Time
	arm := func() {
		if settle == nil {
			settle = time.After(max(o.Debounce, o.MinPeriod-time.Since(w.lastStart)))
		}
	}
	var reloaded <-chan string
	if o.Firewall != nil {
		reloaded = o.Firewall.Reloaded()
	}
	type connected struct {
		fw  Firewall
		err error
	}
	var connecting chan connected
	if o.Firewall == nil && o.ConnectFirewall != nil {
		connecting = make(chan connected, 1)
		go func() {
			fw, err := o.ConnectFirewall()
			connecting <- connected{fw, err}
		}()
	}
	log.Info("watching", "cache", o.CacheDir, "debounce", o.Debounce.String(), "min-sync-period", o.MinPeriod.String(), "interval", o.Interval.String(),
		"firewalld", o.Firewall != nil)
	if w.pass(TriggerStart) {
		arm()
	}
	notify("READY=1")
	for {
		select {
		case <-ctx.Done():
			notify("STOPPING=1")
			log.Info("stopping")
			return nil
		case _, ok := <-events:
			if !ok {
				log.Warn("the nf_tables event subscription ended; passes on the interval only", "interval", o.Interval.String())
				events = nil
				continue
			}
			if o.OnEvent != nil {
				o.OnEvent()
			}
			arm()
		case c := <-connecting:
			connecting = nil
			if c.err != nil {
				log.Info("no system bus: firewalld's reloads are seen through nf_tables events only", "err", c.err)
				continue
			}
			log.Info("following firewalld on the system bus")
			w.o.Firewall, reloaded = c.fw, c.fw.Reloaded()
			if w.last != nil {
				w.checkStrict(w.last)
			}
		case what, ok := <-reloaded:
			if !ok {
				log.Warn("the system bus connection ended; firewalld's reloads are seen through nf_tables events only")
				reloaded, w.o.Firewall = nil, nil // passes no longer ask it
				continue
			}
			if o.OnReload != nil {
				o.OnReload()
			}
			log.Info("firewalld " + what)
			settle = nil // this pass answers the reload's events too
			if w.pass(TriggerReload) {
				arm()
			}
		case <-settle:
			settle = nil
			if w.pass(TriggerEvent) {
				arm()
			}
		case <-interval.C:
			if w.pass(TriggerInterval) {
				arm()
			}
		}
	}
}

// watcher is what the passes of one Watch remember of each other.
type watcher struct {
	a     *Agent
	o     WatchOptions
	drain func()
	log   *slog.Logger
	// seen are the orphans of the last pass and logged those already
	// logged, by owner; withheld and kept those of the last pass, logged
	// when they appear.
	seen, logged   map[string]bool
	withheld, kept map[string]bool
	failing        string // the error of the last pass, logged once
	lastStart      time.Time
	running        atomic.Int64 // when the pass that runs started (unix ns), 0 between passes
	strict         bool         // the firewall manager dropped host ports at the last question
	last           *Report      // the last pass's report
}

// pass runs one pass, logs and reports it, and says whether it changed
// anything (then a pass to confirm follows).
func (w *watcher) pass(trigger string) bool {
	// a pass during a reload would repair what the reload is about to
	// flush again, and its writes could fail the reload's
	if w.o.Firewall != nil {
		if err := w.o.Firewall.Settle(settleTimeout); err != nil {
			w.log.Warn("firewalld did not say whether it is reloading; passing anyway", "err", err)
		}
	}
	if w.drain != nil {
		w.drain()
	}
	so := w.o.Options
	current := map[string]bool{}
	var mu sync.Mutex // backends run concurrently
	if so.Prune {
		// only orphans seen twice go
		so.protect = func(network, id string) bool {
			mu.Lock()
			defer mu.Unlock()
			k := network + "/" + id
			current[k] = true
			return !w.seen[k]
		}
	}
	start := time.Now()
	w.lastStart = start
	w.running.Store(start.UnixNano())
	rep, err := w.a.Sync(so)
	w.running.Store(0)
	took := time.Since(start)
	if so.Prune {
		w.seen = current
	}
	switch {
	case err != nil && err.Error() != w.failing:
		w.failing = err.Error()
		w.log.Error("pass failed", "trigger", trigger, "err", err)
	case err == nil && w.failing != "":
		w.failing = ""
		w.log.Info("passes succeed again", "trigger", trigger)
	}
	var fresh map[string]int
	if rep != nil {
		w.last = rep
		fresh = logHeld(w.log, rep, &w.withheld, &w.kept)
		logChanges(w.log, rep, trigger, took, w.logged)
		if trigger == TriggerStart || trigger == TriggerReload {
			w.checkStrict(rep)
		}
	}
	if w.o.Observe != nil {
		w.o.Observe(PassInfo{Trigger: trigger, Start: start, Took: took, Report: rep, Err: err, NewlyWithheld: fresh})
	}
	// A pass is a burst (at 1000 attachments some 20 MB of listings and
	// parsed rules) and the agent idles until the next one: give the
	// memory back now, in one collection, rather than hold it through the
	// idle minute (make bench: 20 MB resident between passes instead of
	// 30).
	debug.FreeOSMemory()
	return rep != nil && rep.Changed()
}

// feedWatchdog sends WATCHDOG=1 every period until stop, unless a pass
// has run longer than bound (passBound): a stuck pass lets the service manager
// restart the agent, a pass waiting within its bounds does not.
func (w *watcher) feedWatchdog(period, bound time.Duration, notify func(string), stop <-chan struct{}) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if started := w.running.Load(); started == 0 || time.Since(time.Unix(0, started)) < bound {
				notify("WATCHDOG=1")
			}
		}
	}
}

// checkStrict asks the firewall manager whether it drops host ports, and
// warns of every attachment whose host ports it drops: after the first
// pass and after each reload, the only times the setting changes. (ADD
// refuses host ports while it is on; these are attachments made before.)
func (w *watcher) checkStrict(rep *Report) {
	if w.o.Firewall == nil {
		return
	}
	strict, err := w.o.Firewall.StrictForwardPorts()
	switch {
	case err != nil:
		w.log.Warn("firewalld did not say whether its StrictForwardPorts is on", "err", err)
		return
	case !strict && w.strict:
		w.log.Info("firewalld's StrictForwardPorts is off: it lets host ports through again")
	case strict:
		for _, a := range rep.Attachments {
			w.log.Warn("firewalld's StrictForwardPorts drops these host ports: forward them in firewalld, or set it off",
				"network", a.Network, "container", a.ContainerID, "ifname", a.IfName, "hostPorts", a.HostPorts)
		}
	}
	w.strict = strict
}
