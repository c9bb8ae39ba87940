package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// watchFake runs Watch over a fake whose first `writes` passes repair
// something, and returns a function that stops it and counts the passes
// (one Sync of iptables ipv4 each).
func watchFake(t *testing.T, writes int, events <-chan struct{}) (stop func() (passes int, log string)) {
	t.Helper()
	return watchFakeWith(t, writes, events, 0)
}

// watchFakeWith is watchFake with passes minPeriod apart at the least,
// and firewall as the node's firewall manager (nil: none).
func watchFakeWith(t *testing.T, writes int, events <-chan struct{}, minPeriod time.Duration, firewall ...Firewall) (stop func() (passes int, log string)) {
	t.Helper()
	a, h := newFake()
	dir := t.TempDir()
	cacheEntry(t, dir, "net1", "a", "", `[{"hostPort":8080,"containerPort":80}]`, time.Hour)
	h.Localnet["veth-192.0.2.2"] = true
	var mu sync.Mutex
	passes := 0
	h.SyncAnswer = func(be string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report {
		r := converge.NewReport(len(want))
		if be != "iptables" || f != plan.IPv4 {
			return r
		}
		mu.Lock()
		defer mu.Unlock()
		passes++
		if passes <= writes {
			r.Results[0] = converge.Result{State: converge.Repaired, What: "chain missing"}
		}
		return r
	}
	ctx, cancel := context.WithCancel(context.Background())
	var log bytes.Buffer
	done := make(chan error)
	o := WatchOptions{Options: Options{CacheDir: dir}, Interval: time.Hour, Debounce: 50 * time.Millisecond, MinPeriod: minPeriod}
	for _, fw := range firewall {
		if c, ok := fw.(*slowFirewall); ok {
			o.ConnectFirewall = c.connect
			continue
		}
		o.Firewall = fw
	}
	go func() {
		done <- a.Watch(ctx, o, events, nil, slog.New(slog.NewTextHandler(&log, nil)))
	}()
	return func() (int, string) {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Watch: %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Watch did not return after its context ended")
		}
		mu.Lock()
		defer mu.Unlock()
		return passes, log.String()
	}
}

func TestWatchDebouncesEvents(t *testing.T) {
	events := make(chan struct{}, 1)
	stop := watchFake(t, 0, events)
	time.Sleep(20 * time.Millisecond)
	for range 5 { // a reload: many commits in a row
		select {
		case events <- struct{}{}:
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	passes, log := stop()
	if passes != 2 {
		t.Errorf("%d passes, want 2: the start and one for the burst of events", passes)
	}
	if strings.Contains(log, "repaired") {
		t.Errorf("log of passes that found nothing:\n%s", log)
	}
}

// Beside a busy runtime the firewall changes all the time: passes come
// no closer than MinPeriod (without it, one every Debounce: 20 in 1 s).
func TestWatchKeepsAMinimumPeriod(t *testing.T) {
	events := make(chan struct{}, 1)
	stop := watchFakeWith(t, 0, events, 300*time.Millisecond)
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		select {
		case events <- struct{}{}:
		default:
		}
	}
	passes, _ := stop()
	if passes < 3 || passes > 5 {
		t.Errorf("%d passes in 1 s of constant events, want 3 to 5 (the start, then one every 300 ms)", passes)
	}
}

// fakeFirewall is a firewall manager whose reload is under way while
// reloading is held.
type fakeFirewall struct {
	reloaded  chan string
	reloading sync.RWMutex
	settled   atomic.Int32 // the passes Settle let go on
	strict    atomic.Bool  // StrictForwardPorts' answer
	asked     atomic.Int32 // how often it was asked
}

func (f *fakeFirewall) StrictForwardPorts() (bool, error) {
	f.asked.Add(1)
	return f.strict.Load(), nil
}

func (f *fakeFirewall) Reloaded() <-chan string { return f.reloaded }

func (f *fakeFirewall) Settle(time.Duration) error {
	f.reloading.RLock()
	defer f.reloading.RUnlock()
	f.settled.Add(1)
	return nil
}

// TestWatchWaitsOutAReload: the events of a reload under way bring no
// pass until it is over; the reload's signal brings one pass at once
// (not after the debounce), which answers the events too.
func TestWatchWaitsOutAReload(t *testing.T) {
	events := make(chan struct{}, 1)
	fw := &fakeFirewall{reloaded: make(chan string, 1)}
	stop := watchFakeWith(t, 0, events, 0, fw)
	time.Sleep(50 * time.Millisecond) // the start's pass
	fw.reloading.Lock()
	events <- struct{}{}
	time.Sleep(200 * time.Millisecond) // 4 debounce periods: a pass waits
	if n := fw.settled.Load(); n != 1 {
		t.Errorf("%d passes went on, want 1 (the start's): a pass ran during the reload", n)
	}
	fw.reloading.Unlock()
	fw.reloaded <- "reloaded"
	time.Sleep(200 * time.Millisecond)
	passes, log := stop()
	// the start, the event's pass (it waited for the reload), the
	// reload's
	if passes != 3 || strings.Count(log, `msg="firewalld reloaded"`) != 1 {
		t.Errorf("%d passes, want 3; log:\n%s", passes, log)
	}
}

// TestWatchWarnsOfStrictForwardPorts: with StrictForwardPorts on, the
// start's pass warns of each attachment's host ports, a reload's pass
// again; once a reload turned it off, the agent says so. Only those
// passes ask (the setting changes with a reload only).
func TestWatchWarnsOfStrictForwardPorts(t *testing.T) {
	events := make(chan struct{}, 1)
	fw := &fakeFirewall{reloaded: make(chan string, 1)}
	fw.strict.Store(true)
	stop := watchFakeWith(t, 0, events, 0, fw)
	time.Sleep(50 * time.Millisecond)
	events <- struct{}{} // a pass that does not ask
	time.Sleep(150 * time.Millisecond)
	fw.strict.Store(false)
	fw.reloaded <- "reloaded"
	time.Sleep(100 * time.Millisecond)
	_, log := stop()
	warn := `level=WARN msg="firewalld's StrictForwardPorts drops these host ports: forward them in firewalld, or set it off" network=net1 container=a ifname=eth0 hostPorts=8080/tcp`
	if strings.Count(log, warn) != 1 || !strings.Contains(log, "firewalld's StrictForwardPorts is off") || fw.asked.Load() != 2 {
		t.Errorf("asked %d times (want 2: the start, the reload); log (want one warning, then off):\n%s", fw.asked.Load(), log)
	}
}

// slowFirewall is a firewall manager found in the background
// (WatchOptions.ConnectFirewall) once answer is closed: a bus that is
// slow to answer, or, with err, never does.
type slowFirewall struct {
	*fakeFirewall
	answer chan struct{}
	err    error
}

func (s *slowFirewall) connect() (Firewall, error) {
	<-s.answer
	if s.err != nil {
		return nil, s.err
	}
	return s.fakeFirewall, nil
}

// TestWatchDoesNotWaitForTheBus: a firewall manager found in the
// background holds neither the first pass nor readiness; once found,
// its reloads are followed and it is asked about StrictForwardPorts for
// the attachments the passes before it found; one that is never found
// leaves the passes to nf_tables events.
func TestWatchDoesNotWaitForTheBus(t *testing.T) {
	events := make(chan struct{}, 1)
	fw := &slowFirewall{fakeFirewall: &fakeFirewall{reloaded: make(chan string, 1)}, answer: make(chan struct{})}
	fw.strict.Store(true)
	stop := watchFakeWith(t, 0, events, 0, fw)
	time.Sleep(100 * time.Millisecond)
	if n := fw.settled.Load(); n != 0 {
		t.Fatalf("%d passes asked a firewall manager not found yet", n)
	}
	close(fw.answer)
	time.Sleep(50 * time.Millisecond)
	fw.reloaded <- "reloaded"
	time.Sleep(100 * time.Millisecond)
	passes, log := stop()
	// the start's (without it), the reload's (with it)
	if passes != 2 || fw.settled.Load() != 1 || fw.asked.Load() != 2 ||
		!strings.Contains(log, "following firewalld on the system bus") || strings.Count(log, "StrictForwardPorts drops these host ports") != 2 {
		t.Errorf("%d passes (want 2), %d settled (want 1), asked %d times (want 2: when found, after the reload); log:\n%s",
			passes, fw.settled.Load(), fw.asked.Load(), log)
	}

	never := &slowFirewall{fakeFirewall: &fakeFirewall{}, answer: make(chan struct{}), err: errors.New("system bus: no answer in 2s")}
	close(never.answer)
	stop = watchFakeWith(t, 0, events, 0, never)
	time.Sleep(50 * time.Millisecond)
	events <- struct{}{}
	time.Sleep(150 * time.Millisecond)
	passes, log = stop()
	if passes != 2 || !strings.Contains(log, "no system bus: firewalld's reloads are seen through nf_tables events only") {
		t.Errorf("%d passes (want 2: the start's, the event's); log:\n%s", passes, log)
	}
}

// TestWatchOutlivesTheBus: once the firewall manager can no longer be
// followed (the bus connection ended), passes stop asking it.
func TestWatchOutlivesTheBus(t *testing.T) {
	events := make(chan struct{}, 1)
	fw := &fakeFirewall{reloaded: make(chan string)}
	stop := watchFakeWith(t, 0, events, 0, fw)
	time.Sleep(50 * time.Millisecond)
	close(fw.reloaded)
	time.Sleep(50 * time.Millisecond)
	events <- struct{}{}
	time.Sleep(200 * time.Millisecond)
	passes, log := stop()
	if passes != 2 || fw.settled.Load() != 1 || !strings.Contains(log, "the system bus connection ended") {
		t.Errorf("%d passes (want 2), %d asked the firewall manager (want 1, the start's); log:\n%s", passes, fw.settled.Load(), log)
	}
}

func TestWatchFollowsAWritingPassOnce(t *testing.T) {
	stop := watchFake(t, 1, nil)
	time.Sleep(400 * time.Millisecond) // 8 debounce periods
	passes, log := stop()
	if passes != 2 {
		t.Errorf("%d passes, want 2: a pass that wrote, one to confirm, then quiet", passes)
	}
	if !strings.Contains(log, `msg="attachment repaired" network=net1 container=a ifname=eth0 backend=iptables what="ipv4: chain missing"`) ||
		!strings.Contains(log, "msg=stopping") {
		t.Errorf("log:\n%s", log)
	}
}

// TestWatchLogsAFailureOnce: a pass that fails as the last one did logs
// nothing more; the first that succeeds says so; Observe hears every pass
// with its trigger and error.
func TestWatchLogsAFailureOnce(t *testing.T) {
	a, _ := newFake()
	dir := t.TempDir()
	results := filepath.Join(dir, "results")
	if err := os.WriteFile(results, nil, 0o600); err != nil { // not a directory: passes fail
		t.Fatal(err)
	}
	var mu sync.Mutex
	var passes []PassInfo
	var log bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- a.Watch(ctx, WatchOptions{Options: Options{CacheDir: dir}, Interval: 30 * time.Millisecond, Debounce: time.Millisecond,
			Observe: func(p PassInfo) { mu.Lock(); passes = append(passes, p); mu.Unlock() }},
			nil, nil, slog.New(slog.NewTextHandler(&log, nil)))
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(passes) }
	for count() < 4 {
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.Remove(results); err != nil {
		t.Fatal(err)
	}
	n := count()
	for count() < n+2 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(log.String(), `msg="pass failed"`); got != 1 {
		t.Errorf("%d failure records, want 1:\n%s", got, log.String())
	}
	if got := strings.Count(log.String(), `msg="passes succeed again"`); got != 1 {
		t.Errorf("%d recovery records, want 1:\n%s", got, log.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if passes[0].Trigger != TriggerStart || passes[0].Err == nil || passes[1].Trigger != TriggerInterval || passes[len(passes)-1].Err != nil {
		t.Errorf("passes: %+v, want start (failed), interval…, the last ok", passes)
	}
}

// The watchdog is fed while a pass waits within its bounds (here a pass
// of 600 ms, the watchdog's period 50 ms), and not once a pass has run
// longer than passBound: then it is stuck, and the service manager may
// restart the agent.
func TestWatchdogThroughALongPass(t *testing.T) {
	for _, tt := range []struct {
		name  string
		bound time.Duration
		min   int // WATCHDOG=1 during the first pass, at least
		max   int // and at most
	}{
		{"within its bound", 10 * time.Second, 5, 13},
		{"past its bound", 150 * time.Millisecond, 1, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			old := passBound
			passBound = tt.bound
			t.Cleanup(func() { passBound = old })
			a, h := newFake()
			dir := t.TempDir()
			cacheEntry(t, dir, "net1", "a", "", `[{"hostPort":8080,"containerPort":80}]`, time.Hour)
			h.SyncAnswer = func(be string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report {
				if be == "iptables" && f == plan.IPv4 {
					time.Sleep(600 * time.Millisecond)
				}
				return converge.NewReport(len(want))
			}
			var mu sync.Mutex
			var states []string
			o := WatchOptions{Options: Options{CacheDir: dir}, Interval: time.Hour, Debounce: time.Hour, Watchdog: 50 * time.Millisecond,
				Notify: func(s string) { mu.Lock(); defer mu.Unlock(); states = append(states, s) }}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- a.Watch(ctx, o, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
			if !eventually(3*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return slices.Contains(states, "READY=1") }) {
				t.Fatal("not ready 3 s after the start")
			}
			cancel()
			<-done
			mu.Lock()
			defer mu.Unlock()
			during := slices.Index(states, "READY=1") // the first pass ends before READY=1
			if during < tt.min || during > tt.max {
				t.Errorf("%d WATCHDOG=1 during a 600 ms pass, want %d to %d: %q", during, tt.min, tt.max, states)
			}
		})
	}
}

func eventually(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
