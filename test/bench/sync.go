package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/test/nettest"
)

// syncTiming is `portmap-agent sync` (ours only: upstream has none) with n
// cached attachments: a pass with nothing to repair, and a pass after the
// backend's whole state was flushed.
type syncTiming struct {
	Backend    string  `json:"backend"`
	N          int     `json:"n"`
	NothingP50 float64 `json:"nothing_to_repair_p50_ms"`
	// WatchP50 is a pass of `sync --watch` with nothing to repair: the
	// agent in this (isolated) process, keeping what it parsed of the
	// unchanged cache files.
	WatchP50    float64 `json:"watch_pass_p50_ms"`
	RepairP50   float64 `json:"full_repair_p50_ms"`
	RepairCount int     `json:"full_repair_samples"`
	// Agent is the node agent and STATUS on this node.
	Agent agentUsage `json:"agent"`
}

// cacheFill writes the libcni cache entries of the n fill containers,
// as a runtime would have after ADDing them (same config, mappings and
// addresses as fill).
func cacheFill(dir, backend string, n int) {
	conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"bench","plugins":[{"type":"ptp"},`+
		`{"type":"portmap","backend":%q,"capabilities":{"portMappings":true}}]}`, backend)
	for i := range n {
		port := 10000 + i
		err := cnicache.Write(dir, cnicache.Entry{Network: "bench", ContainerID: fmt.Sprintf("fill%d", i), IfName: "eth0",
			NetNS: benchNetns, Conflist: []byte(conflist),
			CapabilityArgs: map[string]any{"portMappings": []any{
				map[string]any{"hostPort": port, "containerPort": 80, "protocol": "tcp"},
				map[string]any{"hostPort": port, "containerPort": 80, "protocol": "udp"}}},
			Result: map[string]any{"cniVersion": "1.0.0",
				"interfaces": []any{map[string]any{"name": "eth0", "sandbox": benchNetns}},
				"ips":        []any{map[string]any{"address": fillIP(i) + "/16", "interface": 0}}}})
		if err != nil {
			fatalf("cache: %v", err)
		}
	}
}

// flushCommands wipe what the backend keeps, as a firewall reload can.
var flushCommands = map[string][][]string{
	"iptables": {{"iptables", "-t", "nat", "-F"}, {"iptables", "-t", "nat", "-X"}, {"ip6tables", "-t", "nat", "-F"}, {"ip6tables", "-t", "nat", "-X"}},
	"nftables": {{"nft", "flush", "ruleset"}},
}

func measureSync(tb *benchTB, backend string, n, samples int, idle time.Duration) syncTiming {
	nettest.ResetNAT(tb)
	bin := binary("ours")
	fill(bin, backend, n)
	dir, err := os.MkdirTemp("", "bench-cache-")
	if err != nil {
		fatalf("%v", err)
	}
	defer os.RemoveAll(dir)
	cacheFill(dir, backend, n)
	run := func(want string) float64 {
		cmd := exec.Command(filepath.Join(nettest.BinDir(), "portmap-agent"), "sync", "--cache-dir", dir)
		cmd.Env = nettest.PluginEnv("", "", "", "")
		start := time.Now()
		out, err := cmd.CombinedOutput()
		d := ms(time.Since(start))
		if err != nil {
			fatalf("sync: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), want) {
			fatalf("sync: want %q in the report:\n%s", want, out[max(0, len(out)-400):])
		}
		return d
	}
	var nothing, repair, watch []float64
	for range samples {
		nothing = append(nothing, run(fmt.Sprintf("%d ok, 0 repaired", n)))
	}
	a := &agent.Agent{Host: host.Real(io.Discard)}
	stop := a.KeepParsed()
	for i := range samples + 1 {
		start := time.Now()
		rep, err := a.Sync(agent.Options{CacheDir: dir})
		d := ms(time.Since(start))
		if err != nil || rep.Summary.OK != n || rep.Changed() {
			fatalf("watch pass: %+v, %v; want %d ok and nothing changed", rep.Summary, err, n)
		}
		if i > 0 { // the first pass parses every file
			watch = append(watch, d)
		}
	}
	stop()
	ag := measureAgent(backend, n, dir, idle)
	var stOK, stFlushed []float64
	for range samples {
		d, code := status(backend, dir)
		if code != 0 {
			fatalf("STATUS with everything in place: code %d", code)
		}
		stOK = append(stOK, d)
	}
	rs := max(1, min(samples, 5))
	for range rs {
		for _, c := range flushCommands[backend] {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				fatalf("%v: %v\n%s", c, err, out)
			}
		}
		d, code := status(backend, dir)
		if code != 0 {
			fatalf("STATUS after a flush: code %d, want 0 (ADD can be served)", code)
		}
		stFlushed = append(stFlushed, d)
		repair = append(repair, run(fmt.Sprintf("0 ok, %d repaired", n)))
	}
	ag.StatusP50, ag.StatusFlushedP50 = percentile(stOK, 50), percentile(stFlushed, 50)
	return syncTiming{Backend: backend, N: n, NothingP50: percentile(nothing, 50), WatchP50: percentile(watch, 50),
		RepairP50: percentile(repair, 50), RepairCount: rs, Agent: ag}
}
