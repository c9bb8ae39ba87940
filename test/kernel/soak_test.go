package kernel

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/portmap-dev/portmap/pkg/agent"
	be "github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/plugins/portmap"
	"github.com/portmap-dev/portmap/test/nettest"
)

// The soak's size: `make test` runs a short one, `make soak` the one the
// issue asks for (-soak.n=1000 -soak.cycles=10000).
var (
	soakN      = flag.Int("soak.n", 100, "attachments in place while the soak cycles")
	soakCycles = flag.Int("soak.cycles", 300, "ADD/DEL cycles per backend (a multiple of 100, at least 200)")
	// The time check is a measurement: make soak asks for it, on a quiet
	// machine; the short soak of make test only reports the times (a
	// timed check beside other work fails on the machine's load).
	soakTiming = flag.Bool("soak.timing", false, "fail when the last 100 cycles cost more than 1.2x the first 100")
)

const (
	soakHostIP   = "198.51.100.10"
	soakLink     = "soak0"
	soakFirstHP  = 30000 // the cycled containers' host ports start here
	soakLastHP   = 39999
	soakSteadyHP = 10000 // the steady attachments' host ports
)

// TestSoak drives the plugin (in this process, as a runtime would call
// the binary) on both backends: with soak.n attachments in place, it runs
// soak.cycles ADD/DEL cycles of containers with 1 to 100 mappings (a
// range with and without an offset, and a UDP port that gets a packet
// each cycle), then checks that the ruleset is what it was, that no
// conntrack entry of a cycled port is left, and that no file descriptor
// or mount was left behind; with -soak.timing (make soak), also that the
// last 100 cycles cost at most 1.2x the first 100 (medians, the same
// sizes in the same order).
func TestSoak(t *testing.T) {
	cycles := *soakCycles
	if cycles < 200 || cycles%100 != 0 {
		t.Fatalf("-soak.cycles=%d: want a multiple of 100, at least 200", cycles)
	}
	soakLinkUp(t)
	for _, kind := range be.Kinds {
		t.Run(string(kind.Name), func(t *testing.T) {
			nettest.ResetNAT(t)
			t.Cleanup(func() { nettest.ResetNAT(t) })
			nettest.Run(t, "conntrack", "-F")
			p := portmap.New()
			p.Stdout, p.Host = io.Discard, host.Real(io.Discard)
			call := func(name string, verb func(*skel.CmdArgs) error, id string, conf []byte) {
				t.Helper()
				if err := verb(&skel.CmdArgs{ContainerID: id, Netns: "/proc/self/ns/net", IfName: "eth0", StdinData: conf}); err != nil {
					t.Fatalf("%s of %s: %v", name, id, err)
				}
			}
			// The runtime's cache, as libcni keeps it: written after ADD,
			// removed after DEL; the agent watches it and prunes.
			cache := t.TempDir()
			for i := range *soakN {
				id, ip, ms := fmt.Sprintf("steady%d", i), fmt.Sprintf("10.98.%d.%d", i/250, i%250+1), []soakMapping{{soakSteadyHP + i, 80, "tcp"}}
				call("ADD", p.Add, id, soakConf(kind.Name, ip, ms))
				soakCache(t, cache, kind.Name, id, ip, ms)
			}
			before := soakRuleset(t)
			w := nettest.StartWatch(t, "portmap-agent", nil, "watching", "--cache-dir", cache, "--prune", "--interval", "1s")
			var fds, mounts int
			times := make([]time.Duration, cycles)
			for i := range cycles {
				id := fmt.Sprintf("cycle%d", i)
				ms := soakMappings(i)
				conf := soakConf(kind.Name, fmt.Sprintf("10.99.%d.%d", (i/250)%250, i%250+1), ms)
				udp := ms[len(ms)-1].HostPort
				start := time.Now()
				call("ADD", p.Add, id, conf)
				times[i] = time.Since(start)
				soakCache(t, cache, kind.Name, id, fmt.Sprintf("10.99.%d.%d", (i/250)%250, i%250+1), ms)
				soakSend(t, udp)
				if i == 0 && soakEntries(t, udp) == 0 {
					t.Fatalf("a packet to UDP %d left no conntrack entry: the leftover check below could not fail", udp)
				}
				start = time.Now()
				call("DEL", p.Del, id, conf)
				times[i] += time.Since(start)
				if err := os.Remove(filepath.Join(cache, "results", "soak-"+id+"-eth0")); err != nil {
					t.Fatal(err)
				}
				if i == 9 { // the first cycles open what the process keeps
					fds, mounts = countFDs(t), countMounts(t)
				}
			}
			// A few of the agent's passes after the last cycle.
			time.Sleep(time.Second)
			if after := soakRuleset(t); after != before {
				t.Errorf("the ruleset changed over %d cycles with the agent watching:\nbefore:\n%s\nafter:\n%s", cycles, before, after)
			}
			if n := soakEntries(t, 0); n != 0 {
				t.Errorf("%d conntrack entries of cycled ports left", n)
			}
			if got := countFDs(t); got != fds {
				t.Errorf("file descriptors: %d after %d cycles, %d after the first 10", got, cycles, fds)
			}
			if got := countMounts(t); got != mounts {
				t.Errorf("mounts: %d after %d cycles, %d after the first 10", got, cycles, mounts)
			}
			w.Terminate(t)
			log := w.Text()
			if strings.Contains(log, "attachment repaired") || strings.Contains(log, "level=ERROR") {
				t.Errorf("the agent repaired or failed something over a soak without a flush:\n%s", log)
			}
			t.Logf("%s: the agent withheld %d cache entries whose DEL had begun, kept %d objects of ADDs not cached yet",
				kind.Name, strings.Count(log, "reason=deleted"), strings.Count(log, "msg=kept"))
			first, last := median(times[:100]), median(times[cycles-100:])
			t.Logf("%s: N=%d, %d cycles: median cycle %v in the first 100, %v in the last 100 (%.2fx)",
				kind.Name, *soakN, cycles, first, last, float64(last)/float64(first))
			if *soakTiming && float64(last) > 1.2*float64(first) {
				t.Errorf("the last 100 cycles cost %v each, the first 100 %v: more than 1.2x", last, first)
			}
		})
	}
}

type soakMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

// soakMappings are cycle i's: 1 to 100 mappings, the same sizes every 100
// cycles; consecutive TCP host ports forwarded to the same ports (even i)
// or with an offset (odd i), then one UDP port.
func soakMappings(i int) []soakMapping {
	n := 1 + (i*37)%100
	base := soakFirstHP + (i%50)*200
	ms := make([]soakMapping, n)
	for j := range ms {
		ms[j] = soakMapping{base + j, base + j, "tcp"}
		if i%2 == 1 {
			ms[j].ContainerPort = 8000 + j
		}
	}
	ms[n-1].Protocol = "udp"
	return ms
}

func soakConf(backend be.Name, ip string, ms []soakMapping) []byte {
	conf := map[string]any{
		"cniVersion":    "1.0.0",
		"name":          "soak",
		"type":          "portmap",
		"backend":       backend,
		"runtimeConfig": map[string]any{"portMappings": ms},
		"prevResult": map[string]any{
			"cniVersion": "1.0.0",
			"interfaces": []map[string]any{{"name": "eth0", "sandbox": "/proc/self/ns/net"}},
			"ips":        []map[string]any{{"address": ip + "/16", "interface": 0}},
		},
	}
	b, err := json.Marshal(conf)
	if err != nil {
		panic(err)
	}
	return b
}

// soakCache writes libcni's cache entry of the soak's attachment, as a
// runtime does after ADD.
func soakCache(t *testing.T, dir string, backend be.Name, id, ip string, ms []soakMapping) {
	t.Helper()
	conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"soak","plugins":[{"type":"portmap","backend":%q,"capabilities":{"portMappings":true}}]}`, backend)
	mappings := make([]any, len(ms))
	for i, m := range ms {
		mappings[i] = map[string]any{"hostPort": m.HostPort, "containerPort": m.ContainerPort, "protocol": m.Protocol}
	}
	e := cnicache.Entry{Network: "soak", ContainerID: id, IfName: "eth0", NetNS: "/proc/self/ns/net", Conflist: []byte(conflist),
		CapabilityArgs: map[string]any{"portMappings": mappings},
		Result: map[string]any{"cniVersion": "1.0.0",
			"interfaces": []any{map[string]any{"name": "eth0", "sandbox": "/proc/self/ns/net"}},
			"ips":        []any{map[string]any{"address": ip + "/16", "interface": 0}}}}
	if err := cnicache.Write(dir, e); err != nil {
		t.Fatal(err)
	}
}

// soakLinkUp gives the namespace a host address and a route to the
// containers' addresses: a veth pair whose peer has no address, so what
// is sent there is dropped after conntrack has confirmed it.
func soakLinkUp(t *testing.T) {
	nettest.Run(t, "ip", "link", "add", soakLink, "type", "veth", "peer", "name", soakLink+"p")
	nettest.Run(t, "ip", "link", "set", soakLink+"p", "up")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", soakLink).Run() })
	nettest.Run(t, "ip", "addr", "add", soakHostIP+"/24", "dev", soakLink)
	nettest.Run(t, "ip", "addr", "add", "10.99.255.254/16", "dev", soakLink)
	nettest.Run(t, "ip", "addr", "add", "10.98.255.254/16", "dev", soakLink)
	nettest.Run(t, "ip", "link", "set", soakLink, "up")
}

// soakSend sends one UDP datagram to the host's address and port.
func soakSend(t *testing.T, port int) {
	t.Helper()
	c, err := net.Dial("udp4", net.JoinHostPort(soakHostIP, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("soak")); err != nil {
		t.Fatal(err)
	}
}

var dportRE = regexp.MustCompile(`dport=(\d+)`)

// soakEntries counts the UDP conntrack entries whose original destination
// port is port, or any cycled port when port is 0.
func soakEntries(t *testing.T, port int) int {
	t.Helper()
	out, err := exec.Command("conntrack", "-L", "-p", "udp").Output()
	if err != nil {
		t.Fatalf("conntrack -L: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		m := dportRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		d, _ := strconv.Atoi(m[1])
		if d == port || (port == 0 && d >= soakFirstHP && d <= soakLastHP) {
			n++
		}
	}
	return n
}

var (
	nftElementsRE = regexp.MustCompile(`(?s)elements = \{(.*?)\}`)
	countersRE    = regexp.MustCompile(`\[\d+:\d+\]`)
)

// soakRuleset is the namespace's ruleset: nft's listing without counters
// (its hash maps' elements sorted: the kernel lists them in hash order,
// which a resize changes) and iptables-save's nat table without counters
// and the date line.
func soakRuleset(t *testing.T) string {
	nft := nftElementsRE.ReplaceAllStringFunc(nettest.Run(t, "nft", "-s", "list", "ruleset"), func(s string) string {
		items := strings.Split(nftElementsRE.FindStringSubmatch(s)[1], ",")
		for i := range items {
			items[i] = strings.TrimSpace(items[i])
		}
		slices.Sort(items)
		return "elements = { " + strings.Join(items, ", ") + " }"
	})
	var ipt []string
	for _, l := range strings.Split(nettest.Run(t, "iptables-save", "-t", "nat"), "\n") {
		if !strings.HasPrefix(l, "#") {
			ipt = append(ipt, countersRE.ReplaceAllString(l, ""))
		}
	}
	return nft + "\n" + strings.Join(ipt, "\n")
}

func countFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

func countMounts(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestSyncPassesKeepSockets: the agent's passes reuse the backends'
// netlink sockets (one per backend and family for the life of the
// agent), so a watcher running for weeks holds as many file descriptors
// as after its first pass.
func TestSyncPassesKeepSockets(t *testing.T) {
	nettest.ResetNAT(t)
	t.Cleanup(func() { nettest.ResetNAT(t) })
	a := &agent.Agent{Host: host.Real(io.Discard)}
	dir := t.TempDir()
	pass := func() {
		t.Helper()
		if _, err := a.Sync(agent.Options{CacheDir: dir}); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	pass()
	fds := countFDs(t)
	for range 20 {
		pass()
	}
	if got := countFDs(t); got != fds {
		t.Errorf("file descriptors: %d after 21 passes, %d after the first", got, fds)
	}
}
