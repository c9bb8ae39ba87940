// Command bench measures this plugin and the upstream portmap plugin (built
// from the plugins module version in go.mod) side by side, in one run, in a
// network namespace of its own: ADD/CHECK/DEL latency with N containers
// already mapped, processes spawned per verb, the no-op start (VERSION), and
// new TCP connections per second through a host port versus directly to the
// container. It prints a table and writes JSON, Markdown and an SVG plot.
//
//	go run ./test/bench -n 0,100,1000 -samples 20 -out test/bench/results
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/portmap-dev/portmap/test/nettest"
)

type options struct {
	ns       []int
	samples  int
	conns    int
	connN    int
	out      string
	backends []string
	syncN    []int
	ms       []int
	services []int
	socket   bool
	idle     time.Duration
}

func main() {
	nettest.RunClientIfAsked() // a client process of the socket-path rows
	var o options
	nList := flag.String("n", "0,100,1000", "numbers of containers already mapped")
	flag.IntVar(&o.samples, "samples", 20, "samples per verb and N")
	flag.IntVar(&o.conns, "conns", 2000, "connections per connection-rate run (bounded by 10s; 0: no connection-rate runs)")
	flag.IntVar(&o.connN, "conn-n", 1000, "mappings installed for the loaded connection-rate run")
	flag.StringVar(&o.out, "out", "test/bench/results", "directory for results.json, results.md and latency.svg")
	backends := flag.String("backends", "iptables,nftables", "backends to measure")
	syncList := flag.String("sync-n", "1000", "numbers of cached attachments for the sync passes (empty: none)")
	mList := flag.String("m", "1,100,1000,5000", "numbers of mappings of one container for the M axis (empty: none)")
	flag.DurationVar(&o.idle, "agent-idle", 30*time.Second, "how long the agent is watched idle (CPU per idle minute)")
	flag.BoolVar(&o.socket, "socket", true, "measure the socket path (\"localhost\": \"socket\") beside the NAT path")
	svcList := flag.String("services", "0,1000", "numbers of kube-proxy Services (its iptables rules) to measure the verbs beside (empty: none)")
	flag.Parse()
	o.ns = intList(*nList)
	o.syncN = intList(*syncList)
	o.ms = intList(*mList)
	o.services = intList(*svcList)
	o.backends = strings.Split(*backends, ",")

	if !nettest.Isolated() {
		os.Exit(outer(o))
	}
	if err := nettest.SetupIsolated(); err != nil {
		fatalf("%v", err)
	}
	// The containers' namespace as the runtime names it: a file that
	// exists (the agent leaves a container whose namespace is gone).
	if err := os.WriteFile(benchNetns, nil, 0o600); err != nil {
		fatalf("%v", err)
	}
	tb := newTB()
	r := run(tb, o)
	tb.cleanup()
	if err := r.write(o.out); err != nil {
		fatalf("%v", err)
	}
	fmt.Print(r.text())
	if failed {
		os.Exit(1)
	}
}

// outer builds what the run needs into temporary directories, runs the
// benchmark in namespaces of its own, removes the directories and returns
// the run's exit code.
func outer(o options) int {
	if os.Geteuid() != 0 {
		fatalf("the benchmark needs root: it makes its own network namespaces")
	}
	tmp, err := os.MkdirTemp("", "portmap-bench-")
	if err != nil {
		fatalf("%v", err)
	}
	defer os.RemoveAll(tmp)
	if os.Getenv(nettest.BinEnv) == "" {
		dir := filepath.Join(tmp, "bin")
		fmt.Fprintln(os.Stderr, "bench: building our plugin, upstream portmap, ptp and host-local")
		if err := nettest.BuildPlugins(dir); err != nil {
			fatalf("%v", err)
		}
		os.Setenv(nettest.BinEnv, dir)
	}
	if err := buildWrap(tmp); err != nil {
		fatalf("%v", err)
	}
	abs, err := filepath.Abs(o.out)
	if err != nil {
		fatalf("%v", err)
	}
	args := append([]string{os.Args[0]}, os.Args[1:]...)
	args = append(args, "-out", abs)
	return nettest.Reexec(args)
}

// report is everything one run measured.
type report struct {
	Date     string       `json:"date"`
	Cores    int          `json:"cores"`
	Kernel   string       `json:"kernel"`
	Tools    string       `json:"tools"`
	Upstream string       `json:"upstream"`
	Samples  int          `json:"samples"`
	Floor    []floor      `json:"floor"`
	Latency  []latency    `json:"latency"`
	Conns    []connRate   `json:"connections"`
	Sync     []syncTiming `json:"sync,omitempty"`
	Many     []manyRow    `json:"many,omitempty"`
	// SocketRates and SocketAdds are the socket path's (issue #16).
	SocketRates []socketRate `json:"socket_connections,omitempty"`
	SocketAdds  []socketAdd  `json:"socket_add,omitempty"`
	// KubeProxy are the verbs beside kube-proxy's rules; N is the
	// number of Services (issue #47).
	KubeProxy []latency     `json:"beside_kube_proxy,omitempty"`
	Notes     []string      `json:"notes,omitempty"`
	start     time.Time     `json:"-"`
	elapsed   time.Duration `json:"-"`
}

type floor struct {
	Plugin string  `json:"plugin"`
	P50    float64 `json:"p50_ms"`
	RSS    int64   `json:"max_rss_kb"`
	// Private is the anonymous memory at exit (KiB; see memory).
	Private int64 `json:"private_kb"`
	Size    int64 `json:"binary_bytes"`
}

type latency struct {
	Plugin  string  `json:"plugin"`
	Backend string  `json:"backend"`
	N       int     `json:"n"`
	Verb    string  `json:"verb"`
	P50     float64 `json:"p50_ms"`
	P90     float64 `json:"p90_ms"`
	Procs   int     `json:"processes"`
}

type connRate struct {
	Plugin   string  `json:"plugin"`
	Backend  string  `json:"backend"`
	N        int     `json:"n"`
	HostPort float64 `json:"hostport_per_s"`
	Direct   float64 `json:"direct_per_s"`
	// Ratio is the median of the rounds' host port ÷ direct, each
	// round's two runs measured one after the other.
	Ratio float64 `json:"hostport_over_direct"`
}

var plugins = []string{"ours", "upstream"}

// binary is the plugin's file in the binary directory.
func binary(plugin string) string {
	if plugin == "upstream" {
		return filepath.Join(nettest.BinDir(), "portmap-upstream")
	}
	return filepath.Join(nettest.BinDir(), "portmap")
}

func run(tb *benchTB, o options) *report {
	r := &report{
		Date:     time.Now().UTC().Format("2006-01-02"),
		Cores:    runtime.NumCPU(),
		Kernel:   strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")),
		Tools:    toolVersions(),
		Upstream: upstreamVersion(),
		Samples:  o.samples,
		start:    time.Now(),
	}
	for _, p := range plugins {
		f := floor{Plugin: p}
		var mem memory
		f.P50, mem = versionFloor(binary(p), o.samples)
		f.RSS, f.Private = mem.Peak, mem.Private
		if st, err := os.Stat(binary(p)); err == nil {
			f.Size = st.Size()
		}
		r.Floor = append(r.Floor, f)
	}
	for _, be := range o.backends {
		for _, p := range plugins {
			r.Latency = append(r.Latency, measureVerbs(p, be, o.ns, o.samples)...)
		}
	}
	if len(o.services) > 0 {
		for _, be := range o.backends {
			for _, p := range plugins {
				r.KubeProxy = append(r.KubeProxy, measureBesideKubeProxy(p, be, o.services, o.samples)...)
			}
		}
	}
	for _, be := range o.backends {
		for _, shape := range manyShapes {
			for _, p := range plugins {
				r.Many = append(r.Many, measureMany(tb, p, be, shape, o.ms, o.samples)...)
			}
		}
	}
	for _, be := range o.backends {
		for _, n := range o.syncN {
			progress("sync ours %s N=%d", be, n)
			r.Sync = append(r.Sync, measureSync(tb, be, n, o.samples, o.idle))
		}
	}
	for _, be := range o.backends {
		if o.conns == 0 {
			break
		}
		for _, p := range plugins {
			for _, n := range []int{0, o.connN} {
				progress("connections %s %s N=%d", p, be, n)
				r.Conns = append(r.Conns, measureConns(p, be, n, o.conns))
			}
		}
	}
	for _, be := range o.backends {
		if !o.socket {
			break
		}
		progress("socket path %s", be)
		r.SocketAdds = append(r.SocketAdds, measureSocketAdd(be, o.samples))
		r.SocketRates = append(r.SocketRates, measureSocketConns(be, o.conns)...)
	}
	r.elapsed = time.Since(r.start)
	return r
}

func intList(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			fatalf("bad number list %q", s)
		}
		out = append(out, n)
	}
	return out
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(1)
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"results.json": append(js, '\n'),
		"results.md":   []byte(r.markdown()),
		"latency.svg":  []byte(r.svg()),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
