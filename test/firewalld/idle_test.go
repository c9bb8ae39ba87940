//go:build firewalld

package firewalld

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/test/nettest"
)

// TestAgentIdle: following firewalld on the bus costs an idle agent
// nothing: between reloads neither an agent on the bus nor one without
// a bus passes, and the one on the bus sends the bus no message (a poll
// would send one at least every second).
func TestAgentIdle(t *testing.T) {
	fw := startFirewalld(t, "trixie", "nftables")
	rt := nettest.NewRuntime(t, nettest.Net{Name: "fw", V4: "192.0.2.0/28", Extra: map[string]string{"backend": `"iptables"`}})
	rt.MustAdd(t, "c1", nettest.Mapping{HostPort: hostPort, ContainerPort: srvPort})
	type agent struct {
		name, metric string
		log          func() string
		p            *os.Process
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
	onBus := busName(t, fw.root, agents[0].p.Pid)
	time.Sleep(time.Second) // the start's passes
	passes := func(a *agent) int {
		resp, err := http.Get(a.metric)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		n := 0
		for _, l := range strings.Split(string(body), "\n") {
			if rest, ok := strings.CutPrefix(l, "portmap_agent_passes_total{"); ok {
				_, v, _ := strings.Cut(rest, "} ")
				k, _ := strconv.Atoi(v)
				n += k
			}
		}
		return n
	}
	const idle = 10 * time.Second
	mon := monitorBus(t, fw.root)
	before := []int{passes(agents[0]), passes(agents[1])}
	time.Sleep(idle)
	after := []int{passes(agents[0]), passes(agents[1])}
	sent := mon.stop(t)
	for i, a := range agents {
		t.Logf("agent %s, idle %s: %d passes", a.name, idle, after[i]-before[i])
		if after[i] != before[i] {
			t.Errorf("agent %s passed %d times in %s without a change", a.name, after[i]-before[i], idle)
		}
	}
	t.Logf("the agent on the bus (%s) sent %d messages in %s", onBus, len(sent[onBus]), idle)
	if len(sent[onBus]) > 0 {
		t.Errorf("the agent on the bus sent %d messages in %s without a change:\n%s", len(sent[onBus]), idle, strings.Join(sent[onBus], "\n"))
	}
}

// busName is the unique name of pid's connection to the system bus,
// as the bus itself tells.
func busName(t *testing.T, root string, pid int) string {
	t.Helper()
	var name string
	if !nettest.Eventually(5*time.Second, func() bool {
		for _, f := range strings.Fields(busCall(root, "ListNames")) {
			if n := strings.Trim(f, `"`); strings.HasPrefix(n, ":") &&
				strings.HasSuffix(busCall(root, "GetConnectionUnixProcessID", "string:"+n), "uint32 "+strconv.Itoa(pid)) {
				name = n
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no connection of process %d on the system bus: %s", pid, busCall(root, "ListNames"))
	}
	return name
}

// busCall calls the bus's own method with args (dbus-send's) and returns
// the reply as dbus-send prints it.
func busCall(root, method string, args ...string) string {
	out, _ := exec.Command("chroot", append([]string{root, "dbus-send", "--system", "--print-reply",
		"--dest=org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus." + method}, args...)...).Output()
	return strings.TrimSpace(string(out))
}

// busMonitor is the root's dbus-monitor watching every message on the
// system bus.
type busMonitor struct {
	root, out string
	cmd       *exec.Cmd
	probes    []string // the probes' names, in order
}

// monitorBus starts a monitor and returns once it has seen a probe's
// call: from then on, no message passes unseen.
func monitorBus(t *testing.T, root string) *busMonitor {
	t.Helper()
	m := &busMonitor{root: root, out: filepath.Join(t.TempDir(), "monitor.log")}
	f, err := os.Create(m.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m.cmd = exec.Command("chroot", root, "dbus-monitor", "--system")
	m.cmd.Stdout, m.cmd.Stderr = f, f
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.cmd.Process.Kill(); _ = m.cmd.Wait() })
	m.probe(t)
	return m
}

// probe calls the bus and waits until the monitor has written the call.
func (m *busMonitor) probe(t *testing.T) {
	t.Helper()
	probe := "portmap.probe.n" + strconv.FormatInt(time.Now().UnixNano(), 10)
	m.probes = append(m.probes, probe)
	if !nettest.Eventually(5*time.Second, func() bool {
		busCall(m.root, "NameHasOwner", "string:"+probe)
		data, _ := os.ReadFile(m.out)
		return strings.Contains(string(data), probe)
	}) {
		data, _ := os.ReadFile(m.out)
		t.Fatalf("dbus-monitor did not see a call in 5 s:\n%s", data)
	}
}

// stop probes once more, ends the monitor and returns the messages each
// sender sent between the first probe and this one, by unique name.
func (m *busMonitor) stop(t *testing.T) map[string][]string {
	t.Helper()
	m.probe(t)
	_ = m.cmd.Process.Signal(unix.SIGTERM)
	_ = m.cmd.Wait()
	data, err := os.ReadFile(m.out)
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string][]string{}
	in := false
	for _, l := range strings.Split(string(data), "\n") {
		switch {
		case strings.Contains(l, m.probes[0]):
			in = true
		case strings.Contains(l, m.probes[len(m.probes)-1]):
			return sent
		}
		if !in {
			continue
		}
		for _, f := range strings.Fields(l) {
			if s, ok := strings.CutPrefix(f, "sender="); ok {
				sent[s] = append(sent[s], l)
			}
		}
	}
	t.Fatalf("dbus-monitor's output lacks the last probe:\n%s", data)
	return nil
}
