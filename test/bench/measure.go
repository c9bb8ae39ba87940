package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/portmap-dev/portmap/test/nettest"
)

// conf is the configuration a runtime would pass for container i of the
// fill (or the probe): a TCP and a UDP mapping of one host port, and a
// prevResult with one IPv4 address.
func conf(backend, ip string, port int) []byte {
	return marshal(nettest.PortmapConf("bench", backend,
		[]nettest.Mapping{{HostPort: port, ContainerPort: 80, Protocol: "tcp"}, {HostPort: port, ContainerPort: 80, Protocol: "udp"}}, ip+"/16"))
}

func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		fatalf("%v", err)
	}
	return b
}

// confTCP is conf without the UDP mapping.
func confTCP(backend, ip string, port int) []byte {
	return marshal(nettest.PortmapConf("bench", backend, []nettest.Mapping{{HostPort: port, ContainerPort: 80, Protocol: "tcp"}}, ip+"/16"))
}

// verbs are the measured verbs: with the TCP and UDP mappings, then ADD
// and DEL with the TCP mapping only.
var verbs = []string{"ADD", "CHECK", "DEL", "ADD tcp", "DEL tcp"}

// keepConntrackEntry sends one datagram to a port nothing listens on in
// this namespace: conntrack keeps an unreplied entry for 30 s.
func keepConntrackEntry() {
	c, err := net.Dial("udp", "127.0.0.1:9")
	if err != nil {
		fatalf("%v", err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("x"))
}

// fillIP is the address of fill container i, in 10.244.0.0/16 (inside this
// benchmark's own namespace, where no route leads there).
func fillIP(i int) string { return fmt.Sprintf("10.244.%d.%d", 1+i/250, 1+i%250) }

const probeIP, probePort = "10.244.0.2", 9999

// benchNetns is CNI_NETNS of every container of the benchmark: a file in
// the tmpfs the isolated process has over /run/cni-portmap.
const benchNetns = "/run/cni-portmap/bench-netns"

// invoke runs one verb of a plugin binary, as a runtime does, and returns
// its duration.
func invoke(bin, verb, id string, stdin []byte, env ...string) (time.Duration, error) {
	cmd := exec.Command(bin)
	cmd.Env = append(nettest.PluginEnv(verb, id, benchNetns, filepath.Dir(bin)), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		return d, fmt.Errorf("%s %s %s: %v: %s", filepath.Base(bin), verb, id, err, strings.TrimSpace(out.String()))
	}
	return d, nil
}

// wrapEnv names the rsswrap binary the outer process built.
const wrapEnv = "PORTMAP_BENCH_RSSWRAP"

// buildWrap builds rsswrap into dir and names it in the environment.
func buildWrap(dir string) error {
	bin := filepath.Join(dir, "rsswrap")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/portmap-dev/portmap/test/bench/rsswrap").CombinedOutput()
	if err != nil {
		return fmt.Errorf("build rsswrap: %v: %s", err, out)
	}
	return os.Setenv(wrapEnv, bin)
}

// memory is one process's memory, in KiB: Peak its peak resident set,
// which counts the pages of its binary that it touched (shared by every
// process of that binary through the page cache), Private its anonymous
// memory when it exited (heap, stacks, the runtime's data): what each
// more process at once costs.
type memory struct{ Peak, Private int64 }

// peakRSS runs one verb as invoke does and returns the process's memory.
// The plugin is started by rsswrap, which reads it: a child of this
// process would carry this process's peak. It is not timed: rsswrap adds
// about 1 ms to a start, so the timed runs are invoke's.
func peakRSS(bin, verb, id string, stdin []byte, env ...string) (memory, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return memory{}, err
	}
	defer r.Close()
	cmd := exec.Command(os.Getenv(wrapEnv), bin)
	cmd.Env = append(nettest.PluginEnv(verb, id, benchNetns, filepath.Dir(bin)), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.ExtraFiles = []*os.File{w}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	w.Close()
	var ns int64
	var mem memory
	report, _ := io.ReadAll(r)
	if _, serr := fmt.Sscanf(string(report), "%d %d %d", &ns, &mem.Peak, &mem.Private); serr != nil && err == nil {
		err = fmt.Errorf("no report from rsswrap (%q): %v", report, serr)
	}
	if err != nil {
		return memory{}, fmt.Errorf("%s %s %s: %v: %s", filepath.Base(bin), verb, id, err, strings.TrimSpace(out.String()))
	}
	return mem, nil
}

// fill maps n containers with the plugin under test.
func fill(bin, backend string, n int) {
	for i := range n {
		if _, err := invoke(bin, "ADD", fmt.Sprintf("fill%d", i), conf(backend, fillIP(i), 10000+i)); err != nil {
			fatalf("fill: %v", err)
		}
	}
}

// measureVerbs times ADD, CHECK and DEL of one more container with n
// already mapped, for every n of ns, then counts the processes each verb
// spawns. Every n has a host of its own, filled first; the samples then go
// round the hosts (sample i at every n, the first host turning), so the
// ratios between the Ns compare runs made side by side.
func measureVerbs(plugin, backend string, ns []int, samples int) []latency {
	bin := binary(plugin)
	return sampleHosts(plugin, backend, ns, samples, func(n int) {
		progress("latency %s %s: fill N=%d", plugin, backend, n)
		fill(bin, backend, n)
	})
}

// sampleHosts is measureVerbs' measurement: a host for every n of ns,
// readied by prepare(n) in it, then the samples round the hosts.
func sampleHosts(plugin, backend string, ns []int, samples int, prepare func(n int)) []latency {
	bin := binary(plugin)
	hosts := make([]*nsHost, len(ns))
	for i, n := range ns {
		hosts[i] = newHost(n)
		defer hosts[i].close()
		hosts[i].do(func() { prepare(n) })
	}
	probe := conf(backend, probeIP, probePort)
	tcp := confTCP(backend, probeIP, probePort)
	times := make([]map[string][]float64, len(ns))
	for i := range times {
		times[i] = map[string][]float64{}
	}
	progress("latency %s %s: %d samples at %v in turn", plugin, backend, samples, ns)
	for s := range samples {
		for k := range hosts {
			i := (s + k) % len(hosts)
			hosts[i].do(func() { sample(bin, probe, tcp, times[i]) })
		}
	}
	var out []latency
	for i, h := range hosts {
		for _, verb := range verbs {
			stdin := probe
			if strings.HasSuffix(verb, " tcp") {
				stdin = tcp
			}
			var procs int
			h.do(func() { procs = countProcs(bin, strings.TrimSuffix(verb, " tcp"), stdin) })
			out = append(out, latency{Plugin: plugin, Backend: backend, N: h.n, Verb: verb,
				P50: percentile(times[i][verb], 50), P90: percentile(times[i][verb], 90),
				Procs: procs})
		}
	}
	return out
}

// sample times each verb of the probe once, in the calling thread's
// namespace, and adds the times to times.
func sample(bin string, probe, tcp []byte, times map[string][]float64) {
	// A node's conntrack table is never empty; this namespace's would be,
	// and the UDP mapping's flush would skip its walk. One unanswered
	// datagram keeps an entry in it.
	keepConntrackEntry()
	for _, verb := range []string{"ADD", "CHECK", "DEL"} {
		d, err := invoke(bin, verb, "probe", probe)
		if err != nil {
			fatalf("%v", err)
		}
		times[verb] = append(times[verb], ms(d))
	}
	// The same container with its TCP mapping only: no conntrack flush,
	// so what is left is the plugin's start and its rules.
	for _, verb := range []string{"ADD", "DEL"} {
		d, err := invoke(bin, verb, "probe", tcp)
		if err != nil {
			fatalf("%v", err)
		}
		times[verb+" tcp"] = append(times[verb+" tcp"], ms(d))
	}
}

// versionFloor is the plugin's own start: VERSION does no work.
func versionFloor(bin string, samples int) (p50 float64, mem memory) {
	var t []float64
	for range samples {
		d, err := invoke(bin, "VERSION", "", nil)
		if err != nil {
			fatalf("%v", err)
		}
		t = append(t, ms(d))
	}
	for range 5 {
		m, err := peakRSS(bin, "VERSION", "", nil)
		if err != nil {
			fatalf("%v", err)
		}
		mem = memory{max(mem.Peak, m.Peak), max(mem.Private, m.Private)}
	}
	return percentile(t, 50), mem
}

// counted are the tools either plugin runs.
var counted = []string{"iptables", "ip6tables", "iptables-restore", "ip6tables-restore",
	"iptables-save", "ip6tables-save", "nft", "conntrack", "sysctl"}

// countProcs runs verb once more with a PATH of shims that count every
// tool process the plugin starts. For DEL the probe is added first, and for
// ADD deleted after, so each verb is counted in its steady state.
func countProcs(bin, verb string, probe []byte) int {
	dir, err := os.MkdirTemp("", "bench-shims-")
	if err != nil {
		fatalf("%v", err)
	}
	defer os.RemoveAll(dir)
	log := filepath.Join(dir, "count")
	for _, tool := range counted {
		real, err := exec.LookPath(tool)
		if err != nil {
			continue
		}
		script := fmt.Sprintf("#!/bin/sh\necho %s >> %s\nexec %s \"$@\"\n", tool, log, real)
		if err := os.WriteFile(filepath.Join(dir, tool), []byte(script), 0o755); err != nil {
			fatalf("%v", err)
		}
	}
	path := "PATH=" + dir + ":" + os.Getenv("PATH")
	if verb != "ADD" {
		if _, err := invoke(bin, "ADD", "probe", probe); err != nil {
			fatalf("%v", err)
		}
	}
	_ = os.Remove(log)
	if _, err := invoke(bin, verb, "probe", probe, path); err != nil {
		fatalf("%v", err)
	}
	n := strings.Count(readFile(log), "\n")
	if verb != "DEL" {
		if _, err := invoke(bin, "DEL", "probe", probe); err != nil {
			fatalf("%v", err)
		}
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// percentile is the nearest-rank percentile of v.
func percentile(v []float64, p int) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

func toolVersions() string {
	var v []string
	for _, tool := range []string{"iptables", "nft"} {
		out, err := exec.Command(tool, "--version").Output()
		if err == nil {
			v = append(v, strings.TrimSpace(string(out)))
		}
	}
	return strings.Join(v, "; ")
}

// upstreamVersion is the plugins module version this program was built
// with, which is the one the upstream binary was built from.
func upstreamVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/containernetworking/plugins" {
				return d.Version
			}
		}
	}
	return "unknown"
}
