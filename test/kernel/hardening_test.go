package kernel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

var backends = []string{"iptables", "nftables"}

// pluginConf is a configuration for container i of network net with one
// TCP and one UDP mapping of port, in both families.
func pluginConf(backend, network string, i, port int) map[string]any {
	return nettest.PortmapConf(network, backend,
		[]nettest.Mapping{{HostPort: port, ContainerPort: 80, Protocol: "tcp"}, {HostPort: port, ContainerPort: 80, Protocol: "udp"}},
		fmt.Sprintf("10.244.%d.%d/16", 1+i/250, 1+i%250), fmt.Sprintf("2001:db8:244::%x/64", i+2))
}

// state is everything both backends keep, both families.
func state(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, fam := range []int{4, 6} {
		b.WriteString(nettest.Save(t, fam))
	}
	for _, fam := range []string{"ip", "ip6"} {
		out, _ := exec.Command("nft", "list", "table", fam, nftables.Table).CombinedOutput()
		b.Write(out)
	}
	return b.String()
}

// attachmentState lists the per-attachment objects left in state.
func attachmentState(s string) []string {
	var left []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "CNI-DN-") || strings.Contains(l, "chain dn-") || strings.Contains(l, "goto dn-") {
			left = append(left, strings.TrimSpace(l))
		}
	}
	return left
}

// TestFiftyParallelAddsThenDels: 50 ADDs at once on a fresh node (no shared
// chains yet), then 50 DELs at once: no failure, the shared jumps exist
// once, nothing of any attachment is left.
func TestFiftyParallelAddsThenDels(t *testing.T) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			nettest.ResetNAT(t)
			const n = 50
			run := func(verb string) {
				var wg sync.WaitGroup
				errs := make([]error, n)
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						out, err := nettest.Exec(t, "portmap", verb, fmt.Sprintf("race%d", i), "/x", pluginConf(be, "race", i, 20000+i))
						if err != nil {
							errs[i] = fmt.Errorf("%w: %s", err, out)
						}
					}()
				}
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Errorf("%s race%d: %v", verb, i, err)
					}
				}
			}
			run("ADD")
			s := state(t)
			shared := map[string]int{"-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT": 2, "-j CNI-HOSTPORT-MASQ": 2}
			perAttachment := "-A CNI-HOSTPORT-DNAT "
			if be == "nftables" {
				shared = map[string]int{"fib daddr type local jump dispatch": 4, "vmap @hostports": 2}
				perAttachment = "chain dn-"
			}
			for rule, want := range shared {
				if got := strings.Count(s, rule); got != want {
					t.Errorf("%q appears %d times, want %d (once per family and hook)", rule, got, want)
				}
			}
			if got, want := strings.Count(s, perAttachment), 2*n*map[bool]int{true: 1, false: 2}[be == "nftables"]; got != want {
				t.Errorf("%d per-attachment objects, want %d", got, want)
			}
			run("DEL")
			if left := attachmentState(state(t)); len(left) > 0 {
				t.Errorf("left after 50 DELs: %v", left)
			}
		})
	}
}

// TestKilledMidwayRecovers kills the plugin with SIGKILL at moments spread
// over an ADD or a DEL, 60 times per backend; after each, the next DEL
// removes everything of the attachment and the next ADD works.
func TestKilledMidwayRecovers(t *testing.T) {
	bin := filepath.Join(nettest.BinDir(), "portmap")
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			nettest.ResetNAT(t)
			conf := pluginConf(be, "crash", 1, 21000)
			stdin, _ := json.Marshal(conf)
			// Another attachment, so the shared state is there as on a
			// busy node, and so DEL must keep it.
			if out, err := nettest.Exec(t, "portmap", "ADD", "other", "/x", pluginConf(be, "crash", 2, 21001)); err != nil {
				t.Fatalf("ADD other: %v %s", err, out)
			}
			killed := 0
			const trials = 60
			for trial := range trials {
				verb := "ADD"
				if trial%2 == 1 {
					verb = "DEL"
				}
				delay := time.Duration(rand.IntN(20000)) * time.Microsecond
				if killAfter(bin, verb, "victim", stdin, delay) {
					killed++
				}
				if out, err := nettest.Exec(t, "portmap", "DEL", "victim", "/x", conf); err != nil {
					t.Fatalf("trial %d (%s killed after %s): DEL: %v %s", trial, verb, delay, err, out)
				}
				var left []string
				for _, l := range attachmentState(state(t)) {
					if strings.Contains(l, victimChain(be)) {
						left = append(left, l)
					}
				}
				if len(left) > 0 {
					t.Fatalf("trial %d (%s killed after %s): DEL left %v", trial, verb, delay, left)
				}
				if out, err := nettest.Exec(t, "portmap", "ADD", "victim", "/x", conf); err != nil {
					t.Fatalf("trial %d: ADD after the kill: %v %s", trial, err, out)
				}
				if out, err := nettest.Exec(t, "portmap", "CHECK", "victim", "/x", conf); err != nil {
					t.Fatalf("trial %d: CHECK after ADD: %v %s", trial, err, out)
				}
			}
			if out, err := nettest.Exec(t, "portmap", "CHECK", "other", "/x", pluginConf(be, "crash", 2, 21001)); err != nil {
				t.Errorf("the other attachment after %d kills: %v %s", trials, err, out)
			}
			t.Logf("%d trials, %d killed before they finished", trials, killed)
			if killed < trials/4 {
				t.Errorf("only %d of %d trials were killed midway: the delays miss the plugin's run", killed, trials)
			}
		})
	}
}

func victimChain(be string) string {
	o := plan.Owner{Network: "crash", ContainerID: "victim", IfName: "eth0"}
	if be == "nftables" {
		return nftables.ChainName(o)
	}
	return iptables.ChainName(o)
}

// killAfter starts verb and sends SIGKILL to it (and its children) after
// delay; it reports whether the plugin was still running then.
func killAfter(bin, verb, id string, stdin []byte, delay time.Duration) bool {
	cmd := exec.Command(bin)
	cmd.Env = nettest.PluginEnv(verb, id, "/x", filepath.Dir(bin))
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return false
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
		return false
	case <-time.After(delay):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return true
	}
}

// TestLongNames: a 300-character container ID and a long network name are
// handled: rules stay correct, comments are cut within the kernel's
// limits, and ADD/CHECK/DEL work on both backends.
func TestLongNames(t *testing.T) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			nettest.ResetNAT(t)
			id := strings.Repeat("c0ffee", 50)
			conf := pluginConf(be, strings.Repeat("n", 120), 3, 21100)
			for _, verb := range []string{"ADD", "CHECK", "DEL"} {
				if out, err := nettest.Exec(t, "portmap", verb, id, "/x", conf); err != nil {
					t.Fatalf("%s: %v %s", verb, err, out)
				}
			}
			if left := attachmentState(state(t)); len(left) > 0 {
				t.Errorf("left after DEL: %v", left)
			}
		})
	}
}

// TestBadInputChangesNothing runs the real binary with bad input on a node
// with state, and compares the state before and after.
func TestBadInputChangesNothing(t *testing.T) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			nettest.ResetNAT(t)
			if out, err := nettest.Exec(t, "portmap", "ADD", "good", "/x", pluginConf(be, "bad", 1, 21200)); err != nil {
				t.Fatalf("ADD good: %v %s", err, out)
			}
			before := state(t)
			cases := map[string]func(map[string]any){
				"hostPort 70000": func(c map[string]any) {
					c["runtimeConfig"] = map[string]any{"portMappings": []map[string]any{{"hostPort": 70000, "containerPort": 80}}}
				},
				"protocol icmp": func(c map[string]any) {
					c["runtimeConfig"] = map[string]any{"portMappings": []map[string]any{{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}}}
				},
				"hostIP garbage": func(c map[string]any) {
					c["runtimeConfig"] = map[string]any{"portMappings": []map[string]any{{"hostPort": 80, "containerPort": 80, "hostIP": "not-an-ip"}}}
				},
				"condition injection": func(c map[string]any) {
					if be == "iptables" {
						c["conditionsV4"] = []string{"-d", "1.2.3.4\n-A INPUT -j ACCEPT"}
					} else {
						c["conditionsV4"] = []string{"ip saddr 1.2.3.4; flush ruleset"}
					}
				},
				"markMasqBit 40": func(c map[string]any) { c["markMasqBit"] = 40 },
			}
			for name, mod := range cases {
				conf := pluginConf(be, "bad", 2, 21201)
				mod(conf)
				out, err := nettest.Exec(t, "portmap", "ADD", "victim", "/x", conf)
				if err == nil || !strings.Contains(string(out), `"code": 7`) {
					t.Errorf("%s: ADD answered %v %s, want code 7", name, err, out)
				}
			}
			if after := state(t); after != before {
				t.Errorf("bad input changed the node:\n--- before\n%s\n--- after\n%s", before, after)
			}
		})
	}
}
