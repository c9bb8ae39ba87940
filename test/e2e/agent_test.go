package e2e

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/test/nettest"
)

// agentProbe is a running portmap-agent's HTTP endpoints.
type agentProbe struct {
	t    *testing.T
	base string
}

func (a agentProbe) get(path string) (int, string) {
	a.t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(a.base + path)
	if err != nil {
		a.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metric is the value of the sample name{labels} ("" for none) in
// /metrics, -1 when absent.
func (a agentProbe) metric(name, labels string) float64 {
	a.t.Helper()
	_, body := a.get("/metrics")
	want := name
	if labels != "" {
		want += "{" + labels + "}"
	}
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, want+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				a.t.Fatalf("metric %s: %q", want, l)
			}
			return f
		}
	}
	return -1
}

// TestAgentTellsHowItIs: portmap-agent sync --watch --metrics-addr
// 127.0.0.1:0 logs the address it bound (JSON log lines); /readyz and
// /healthz answer 503 with the reason while passes fail (the cache's
// results/ is not a directory), 200 once one succeeded; a firewall flush
// shows in /metrics as an nf_tables event, an event-triggered pass and an
// attachment repair; a pass failing again turns /healthz to 503 within two
// intervals; systemd hears READY=1 after the first pass, WATCHDOG=1 from
// the loop and STOPPING=1; SIGTERM ends it with status 0.
func TestAgentTellsHowItIs(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cl := client(t)
		cache := t.TempDir()
		rt := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "agent", V4: "192.0.2.0/28", Extra: extra}, cache)
		c := rt.MustAdd(t, "g1", nettest.Mapping{HostPort: 6501, ContainerPort: srvPort})
		nettest.Serve(t, c.NS, "g1", srvPort)
		expectReply(t, cl, "tcp", addr(nodeIP, 6501), "g1", clientIP)

		results := filepath.Join(cache, "results")
		breakCache := func() {
			if err := os.Rename(results, results+".away"); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(results, []byte("not a directory"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		mendCache := func() {
			if err := os.Remove(results); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(results+".away", results); err != nil {
				t.Fatal(err)
			}
		}
		notify, states := listenNotify(t)

		breakCache()
		const interval = time.Second
		w := startWatchOf(t, "portmap-agent", []string{"NOTIFY_SOCKET=" + notify, "WATCHDOG_USEC=400000"},
			`"msg":"serving /metrics, /healthz and /readyz"`,
			"--cache-dir", cache, "--interval", interval.String(), "--metrics-addr", "127.0.0.1:0", "--log-format", "json")
		m := regexp.MustCompile(`"addr":"(127\.0\.0\.1:\d+)"`).FindStringSubmatch(w.Text())
		if m == nil {
			t.Fatalf("no bound address in the log:\n%s", w.Text())
		}
		a := agentProbe{t, "http://" + m[1]}
		if !nettest.Eventually(2*time.Second, func() bool { return a.metric("portmap_agent_errors_total", `kind="pass"`) >= 1 }) {
			t.Fatalf("no failed pass counted")
		}
		if code, body := a.get("/readyz"); code != 503 || !strings.Contains(body, "no pass has succeeded") {
			t.Errorf("/readyz before a pass succeeded: %d %q, want 503 and why", code, body)
		}
		if code, body := a.get("/healthz"); code != 503 || !strings.Contains(body, "failed") || !strings.Contains(body, "not a directory") {
			t.Errorf("/healthz while passes fail: %d %q, want 503 naming the error", code, body)
		}

		mendCache()
		if !nettest.Eventually(2*interval+time.Second, func() bool { code, _ := a.get("/readyz"); return code == 200 }) {
			t.Fatalf("/readyz not 200 within two intervals of the cache being mended")
		}
		if code, body := a.get("/healthz"); code != 200 || !strings.HasPrefix(body, "ok") {
			t.Errorf("/healthz after a successful pass: %d %q", code, body)
		}

		events := a.metric("portmap_agent_nftables_events_total", "")
		byEvent := a.metric("portmap_agent_passes_total", `trigger="event"`)
		repairs := a.metric("portmap_agent_repairs_total", `kind="attachment"`)
		b.flushFirewall(t)
		if !nettest.Eventually(2*time.Second, func() bool { return a.metric("portmap_agent_repairs_total", `kind="attachment"`) > repairs }) {
			t.Fatalf("no repair counted 2 s after %v", b.flush)
		}
		expectReply(t, cl, "tcp", addr(nodeIP, 6501), "g1", clientIP)
		if got := a.metric("portmap_agent_nftables_events_total", ""); got <= events {
			t.Errorf("nf_tables events %v after the flush, want more than %v", got, events)
		}
		// The interval's pass may repair first (both wait out the minimum
		// sync period); the events' pass still follows.
		if !nettest.Eventually(2*time.Second, func() bool { return a.metric("portmap_agent_passes_total", `trigger="event"`) > byEvent }) {
			t.Errorf("no event-triggered pass 2 s after the flush (%v before it)", byEvent)
		}
		for _, name := range []string{"portmap_agent_pass_duration_seconds_count", "portmap_agent_last_success_timestamp_seconds",
			"portmap_agent_attachments", "portmap_agent_orphans", "portmap_agent_cache_entries_corrupt", "portmap_agent_orphans_pruned_total"} {
			if a.metric(name, "") < 0 {
				t.Errorf("/metrics lacks %s", name)
			}
		}
		if got := a.metric("portmap_agent_attachments", ""); got != 1 {
			t.Errorf("attachments %v, want 1", got)
		}
		if code, _ := a.get("/healthz"); code != 200 {
			t.Errorf("/healthz after the repair: %d", code)
		}

		breakCache()
		start := time.Now()
		if !nettest.Eventually(2*interval+time.Second, func() bool { code, _ := a.get("/healthz"); return code == 503 }) {
			t.Errorf("/healthz still 200 %s after passes began to fail", time.Since(start))
		}
		t.Logf("/healthz 503 %s after the cache broke", time.Since(start).Round(time.Millisecond))
		mendCache()

		w.Terminate(t)
		got := states()
		if len(got) < 3 || got[0] != "READY=1" || got[len(got)-1] != "STOPPING=1" || !contains(got, "WATCHDOG=1") {
			t.Errorf("systemd heard %q, want READY=1 first, WATCHDOG=1, STOPPING=1 last", got)
		}
		for _, l := range strings.Split(w.Text(), "\n") {
			var rec map[string]any
			if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil || rec["time"] == nil {
				t.Errorf("log line is not a JSON record: %q (%v)", l, err)
			}
		}
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// listenNotify listens where NOTIFY_SOCKET will point, as systemd does,
// and returns its path and a function that returns the states received.
func listenNotify(t *testing.T) (string, func() []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Read as systemd does, all the time: a socket's queue holds a few
	// datagrams (net.unix.max_dgram_qlen), and a sender blocks on a full
	// one.
	var mu sync.Mutex
	var got []string
	go func() {
		buf := make([]byte, 256)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			mu.Lock()
			got = append(got, string(buf[:n]))
			mu.Unlock()
		}
	}()
	return path, func() []string {
		time.Sleep(100 * time.Millisecond) // what was sent last
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}
