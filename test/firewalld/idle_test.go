//go:build firewalld

package firewalld

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/test/nettest"
)

// TestAgentIdle: following firewalld on the bus costs an idle agent
// nothing: between reloads it passes no more than one without a bus
// (none in the window), and its threads wake no more often.
func TestAgentIdle(t *testing.T) {
	startFirewalld(t, "trixie", "nftables")
	rt := nettest.NewRuntime(t, nettest.Net{Name: "fw", V4: "192.0.2.0/28", Extra: map[string]string{"backend": `"iptables"`}})
	rt.MustAdd(t, "c1", nettest.Mapping{HostPort: hostPort, ContainerPort: srvPort})
	type agent struct {
		name   string
		log    func() string
		p      *os.Process
		metric string
	}
	var agents []*agent
	for _, a := range []struct {
		name string
		env  []string
	}{{"on the bus", nil}, {"without a bus", []string{"DBUS_SYSTEM_BUS_ADDRESS=unix:path=/run/portmap-no-bus"}}} {
		log, p := startAgentWith(t, a.env, "--cache-dir", rt.CacheDir, "--metrics-addr", "127.0.0.1:0")
		agents = append(agents, &agent{name: a.name, log: log, p: p})
	}
	serving := regexp.MustCompile(`serving /metrics.* addr=(\S+)`)
	for _, a := range agents {
		if !nettest.Eventually(5*time.Second, func() bool { return serving.MatchString(a.log()) }) {
			t.Fatalf("agent %s: no metrics address in its log:\n%s", a.name, a.log())
		}
		a.metric = "http://" + serving.FindStringSubmatch(a.log())[1] + "/metrics"
	}
	if !strings.Contains(agents[0].log(), "following firewalld on the system bus") || !strings.Contains(agents[1].log(), "no system bus") {
		t.Fatalf("the agents do not follow firewalld as set up:\n%s\n%s", agents[0].log(), agents[1].log())
	}
	time.Sleep(time.Second) // the start's passes
	type sample struct{ passes, wakeups int }
	measure := func(a *agent) sample {
		resp, err := http.Get(a.metric)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var s sample
		for _, l := range strings.Split(string(body), "\n") {
			if rest, ok := strings.CutPrefix(l, "portmap_agent_passes_total{"); ok {
				_, v, _ := strings.Cut(rest, "} ")
				n, _ := strconv.Atoi(v)
				s.passes += n
			}
		}
		s.wakeups = wakeups(t, a.p.Pid)
		return s
	}
	const idle = 10 * time.Second
	before := []sample{measure(agents[0]), measure(agents[1])}
	time.Sleep(idle)
	after := []sample{measure(agents[0]), measure(agents[1])}
	for i, a := range agents {
		t.Logf("agent %s, idle %s: %d passes, %d voluntary context switches", a.name, idle, after[i].passes-before[i].passes, after[i].wakeups-before[i].wakeups)
		if after[i].passes != before[i].passes {
			t.Errorf("agent %s passed %d times in %s without a change", a.name, after[i].passes-before[i].passes, idle)
		}
	}
	// the two /metrics requests wake each agent alike; a poll of the bus
	// once a second costs at least two wakeups (the call, its answer),
	// 20 in the idle time, above the runtime's own noise (up to 13 more
	// for one of two idle agents, seen with CI beside it)
	if on, off := after[0].wakeups-before[0].wakeups, after[1].wakeups-before[1].wakeups; on > off+16 {
		t.Errorf("the agent on the bus woke %d times in %s, the one without a bus %d", on, idle, off)
	}
}

// wakeups sums the voluntary context switches of the process's threads.
func wakeups(t *testing.T, pid int) int {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "status"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	n := 0
	for _, f := range dirs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that ended
		}
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "voluntary_ctxt_switches:"); ok {
				k, _ := strconv.Atoi(strings.TrimSpace(v))
				n += k
			}
		}
	}
	return n
}
