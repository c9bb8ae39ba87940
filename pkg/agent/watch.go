package agent

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/portmap-dev/portmap/pkg/cnicache"
)

// WatchOptions are the flags of `portmap sync --watch`.
type WatchOptions struct {
	Options
	// Interval is the time between passes without an event (iptables-legacy
	// raises none).
	Interval time.Duration
	// Debounce is how long events must be quiet before a pass: a reload
	// commits many changes in a row.
	Debounce time.Duration
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
func (a *Agent) Watch(ctx context.Context, o WatchOptions, events <-chan struct{}, drain func(), log io.Writer) error {
	seen := map[string]bool{}   // orphans of the last pass, by owner
	logged := map[string]bool{} // orphans already logged
	defer a.KeepParsed()()
	pass := func(reason string) bool {
		if drain != nil {
			drain()
		}
		so := o.Options
		current := map[string]bool{}
		var mu sync.Mutex // backends run concurrently
		if so.Prune {
			so.protect = func(network, id string) bool {
				mu.Lock()
				defer mu.Unlock()
				k := network + "/" + id
				current[k] = true
				return !seen[k]
			}
		}
		start := time.Now()
		rep, err := a.Sync(so)
		if so.Prune {
			seen = current
		}
		if err != nil {
			fmt.Fprintf(log, "%s portmap sync (%s): %v\n", stamp(), reason, err)
		}
		if rep == nil {
			return false
		}
		logChanges(log, rep, reason, time.Since(start), logged)
		return rep.Changed()
	}

	interval := time.NewTicker(o.Interval)
	defer interval.Stop()
	var settle <-chan time.Time
	arm := func() {
		if settle == nil {
			settle = time.After(o.Debounce)
		}
	}
	fmt.Fprintf(log, "%s portmap sync --watch: cache %s, a pass on nf_tables events (debounce %s) and every %s\n",
		stamp(), o.CacheDir, o.Debounce, o.Interval)
	if pass("start") {
		arm()
	}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintf(log, "%s portmap sync --watch: stopping\n", stamp())
			return nil
		case _, ok := <-events:
			if !ok {
				fmt.Fprintf(log, "%s portmap sync --watch: the event subscription ended; passes every %s only\n", stamp(), o.Interval)
				events = nil
				continue
			}
			arm()
		case <-settle:
			settle = nil
			if pass("firewall changed") {
				arm()
			}
		case <-interval.C:
			if pass("interval") {
				arm()
			}
		}
	}
}

func stamp() string { return time.Now().UTC().Format(time.RFC3339) }

// logChanges writes what a pass found wrong or did, one line each, and a
// summary; nothing when everything was right. Orphans that are only
// listed are logged once.
func logChanges(w io.Writer, r *Report, reason string, took time.Duration, logged map[string]bool) {
	var lines []string
	for _, a := range r.Attachments {
		if a.State != "ok" {
			lines = append(lines, a.line())
		}
	}
	for _, s := range r.Shared {
		lines = append(lines, s.line(false))
	}
	for _, o := range r.Orphans {
		k := o.Backend + o.Family + o.Object
		if o.State == "orphan" && logged[k] {
			continue
		}
		logged[k] = true
		lines = append(lines, o.line(false))
	}
	for _, s := range r.Skipped {
		if s.Error && !logged[s.File] {
			logged[s.File] = true
			lines = append(lines, s.line())
		}
	}
	if len(lines) == 0 {
		return
	}
	ts := stamp()
	for _, l := range lines {
		fmt.Fprintf(w, "%s %s\n", ts, l)
	}
	sm := r.Summary
	fmt.Fprintf(w, "%s portmap sync (%s, %s): %d attachments: %d ok, %d repaired, %d errors; %d orphans, %d pruned\n",
		ts, reason, took.Round(time.Millisecond), sm.Attachments, sm.OK, sm.Repaired, sm.Errors, sm.Orphans, sm.Pruned)
}
