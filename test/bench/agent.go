package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/portmap-dev/portmap/test/nettest"
)

// agentUsage is what the node agent (portmap-agent sync --watch) costs
// with n cached attachments: its resident memory after 10 passes, and its
// CPU and passes in an idle window (no firewall change, the default
// 60 s interval not yet due). And STATUS of the plugin on that node.
type agentUsage struct {
	Backend string `json:"backend"`
	N       int    `json:"n"`
	// RSSKB is VmRSS after 10 passes, between two; PeakKB is VmHWM (in
	// a pass).
	RSSKB  int64 `json:"rss_after_10_passes_kb"`
	PeakKB int64 `json:"peak_rss_kb"`
	// IdleSeconds long, the agent used IdleCPUms of CPU and passed
	// IdlePasses times; IdleCPUPerMin is the CPU scaled to a minute.
	IdleSeconds   float64 `json:"idle_seconds"`
	IdleCPUms     float64 `json:"idle_cpu_ms"`
	IdleCPUPerMin float64 `json:"idle_cpu_ms_per_minute"`
	IdlePasses    int     `json:"idle_passes"`
	// StatusP50 is STATUS with everything in place, StatusFlushedP50
	// after a flush of the firewall (both code 0: ADD can be served).
	StatusP50        float64 `json:"status_p50_ms"`
	StatusFlushedP50 float64 `json:"status_after_flush_p50_ms"`
}

// agentProc is a running portmap-agent and its endpoints.
type agentProc struct {
	cmd  *exec.Cmd
	base string
}

// startAgent runs portmap-agent sync --watch on the cache dir, with the
// metrics on a port it picks, and waits for the address.
func startAgent(dir string, interval time.Duration) *agentProc {
	bin := filepath.Join(nettest.BinDir(), "portmap-agent")
	cmd := exec.Command(bin, "sync", "--watch", "--cache-dir", dir, "--interval", interval.String(),
		"--metrics-addr", "127.0.0.1:0", "--log-format", "json")
	cmd.Env = nettest.PluginEnv("", "", "", "")
	out, err := cmd.StdoutPipe()
	if err != nil {
		fatalf("%v", err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		fatalf("start the agent: %v", err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		re := regexp.MustCompile(`"addr":"([^"]+)"`)
		sent := false
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil && !sent {
				addr <- m[1]
				sent = true
			}
		}
	}()
	select {
	case a := <-addr:
		return &agentProc{cmd: cmd, base: "http://" + a}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		fatalf("the agent did not log its address within 10 s")
	}
	return nil
}

func (a *agentProc) stop() {
	_ = a.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = a.cmd.Process.Kill()
		<-done
	}
}

// passes is the sum of the agent's passes of every trigger.
func (a *agentProc) passes() int {
	resp, err := http.Get(a.base + "/metrics")
	if err != nil {
		fatalf("agent metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	n := 0
	for _, l := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(l, "portmap_agent_passes_total{"); ok {
			f, _ := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
			n += int(f)
		}
	}
	return n
}

func (a *agentProc) waitPasses(n int, d time.Duration) {
	for end := time.Now().Add(d); a.passes() < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			fatalf("the agent made %d passes in %s, want %d", a.passes(), d, n)
		}
	}
}

// procStatusKB is a "VmXXX:" line of /proc/PID/status in kB.
func procStatusKB(pid int, key string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		fatalf("%v", err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, key+":"); ok {
			v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return v
		}
	}
	return 0
}

// cpuMS is the process's user and system CPU time so far.
func cpuMS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		fatalf("%v", err)
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64) // utime, field 14
	s, _ := strconv.ParseFloat(f[12], 64) // stime, field 15
	return (u + s) * 1000 / 100           // USER_HZ = 100
}

// measureAgent measures the agent on the node measureSync filled: RSS
// after 10 passes (a pass every 200 ms), then a fresh agent at the default
// interval, idle for idle.
func measureAgent(backend string, n int, dir string, idle time.Duration) agentUsage {
	u := agentUsage{Backend: backend, N: n}
	a := startAgent(dir, 200*time.Millisecond)
	a.waitPasses(11, 2*time.Minute) // the start and 10 more
	pid := a.cmd.Process.Pid
	// Between passes: the least of samples over two intervals (a sample
	// may fall in a pass, whose peak VmHWM keeps).
	u.RSSKB = procStatusKB(pid, "VmRSS")
	for end := time.Now().Add(400 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		u.RSSKB = min(u.RSSKB, procStatusKB(pid, "VmRSS"))
	}
	u.PeakKB = procStatusKB(pid, "VmHWM")
	a.stop()

	a = startAgent(dir, time.Minute)
	a.waitPasses(1, time.Minute)
	time.Sleep(time.Second) // the first pass's garbage settles
	passes := a.passes()
	before := cpuMS(a.cmd.Process.Pid)
	time.Sleep(idle)
	u.IdleCPUms = cpuMS(a.cmd.Process.Pid) - before
	u.IdlePasses = a.passes() - passes
	a.stop()
	u.IdleSeconds = idle.Seconds()
	u.IdleCPUPerMin = u.IdleCPUms * 60 / idle.Seconds()
	return u
}

// statusConf is the bench network's configuration as STATUS gets it.
func statusConf(backend, dir string) []byte {
	return marshal(map[string]any{"cniVersion": "1.1.0", "name": "bench", "type": "portmap", "backend": backend, "cniCacheDir": dir})
}

// status runs the plugin's STATUS and returns its time and error code (0:
// success).
func status(backend, dir string) (float64, int) {
	cmd := exec.Command(binary("ours"))
	cmd.Env = nettest.PluginEnv("STATUS", "", "", nettest.BinDir())
	cmd.Stdin = bytes.NewReader(statusConf(backend, dir))
	start := time.Now()
	out, err := cmd.Output()
	d := ms(time.Since(start))
	if err == nil {
		return d, 0
	}
	var e struct{ Code int }
	if jerr := json.Unmarshal(out, &e); jerr != nil || e.Code == 0 {
		fatalf("STATUS: %v\n%s", err, out)
	}
	return d, e.Code
}
