package nodesafety

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/test/nettest"
)

// passes reads the agent's passes so far from its /metrics.
func passes(t *testing.T, metrics string) int {
	t.Helper()
	resp, err := http.Get(metrics)
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

// storm commits to a table of another program's (kube-proxy's nftables
// mode, say: a chain added and removed) rate times a second for d.
func storm(t *testing.T, rate int, d time.Duration) int {
	t.Helper()
	c, err := nfnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := func(m int, attrs func(*nfnl.Attrs)) nfnl.Msg {
		var a nfnl.Attrs
		attrs(&a)
		return nfnl.Msg{Type: nfnl.NftType(m), Flags: unix.NLM_F_CREATE, Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()}
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		<-tick.C
		name := fmt.Sprintf("svc-%d", n%2)
		op := unix.NFT_MSG_NEWCHAIN
		if n%4 >= 2 {
			op = unix.NFT_MSG_DELCHAIN
		}
		err := c.Batch([]nfnl.Msg{
			msg(unix.NFT_MSG_NEWTABLE, func(a *nfnl.Attrs) { a.String(unix.NFTA_TABLE_NAME, "kube-proxy") }),
			msg(op, func(a *nfnl.Attrs) { a.String(unix.NFTA_CHAIN_TABLE, "kube-proxy").String(unix.NFTA_CHAIN_NAME, name) }),
		}, true)
		if err != nil {
			t.Fatalf("commit %d to the other table: %v", n, err)
		}
	}
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "ip", "kube-proxy").Run() })
	return n
}

// kubeProxyChurn commits as kube-proxy's iptables mode does on a busy
// cluster, rate times a second for d: iptables-restore --noflush of its
// own chains in the nat table (200 rules over 20 service chains, each
// commit refilling them).
func kubeProxyChurn(t *testing.T, rate int, d time.Duration) int {
	t.Helper()
	var b strings.Builder
	b.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n")
	for s := range 20 {
		fmt.Fprintf(&b, ":KUBE-SVC-STORM%02d - [0:0]\n", s)
	}
	for s := range 20 {
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d 10.96.0.%d/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-STORM%02d\n", s+1, s)
		for e := range 9 {
			fmt.Fprintf(&b, "-A KUBE-SVC-STORM%02d -p tcp -m comment --comment \"ep %d\" -j RETURN\n", s, e)
		}
	}
	b.WriteString("COMMIT\n")
	input := b.String()
	t.Cleanup(func() {
		_ = exec.Command("iptables", "-t", "nat", "-F", "KUBE-SERVICES").Run()
		for s := range 20 {
			_ = exec.Command("iptables", "-t", "nat", "-F", fmt.Sprintf("KUBE-SVC-STORM%02d", s)).Run()
			_ = exec.Command("iptables", "-t", "nat", "-X", fmt.Sprintf("KUBE-SVC-STORM%02d", s)).Run()
		}
		_ = exec.Command("iptables", "-t", "nat", "-X", "KUBE-SERVICES").Run()
	})
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		<-tick.C
		cmd := exec.Command("iptables-restore", "--noflush")
		cmd.Stdin = strings.NewReader(input)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kube-proxy's commit %d: %v\n%s", n, err, out)
		}
	}
	return n
}

// TestForeignCommitStorm: with the agent watching (as the DaemonSet runs
// it), another program
// committing to a table of its own 20 times a second starts no pass (it
// took one a --min-sync-period before), and neither does kube-proxy's
// iptables mode committing to its own chains in the nat table 20 times a
// second; a change to a chain of the nat table that jumps to portmap's
// still does. ADD's p50 beside the storm with the agent watching and with
// none is logged (make bench judges speed).
func TestForeignCommitStorm(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string, extra map[string]string) {
		nettest.ResetNAT(t)
		rt := nettest.NewRuntime(t, nettest.Net{Name: "storm", V4: "192.0.2.80/28", Extra: extra})
		rt.MustAdd(t, "c1", nettest.Mapping{HostPort: 6300, ContainerPort: srvPort})
		addP50 := func() time.Duration {
			var ds []time.Duration
			for i := range 10 {
				start := time.Now()
				c := rt.MustAdd(t, fmt.Sprintf("p%d", i), nettest.Mapping{HostPort: 6310 + i, ContainerPort: srvPort})
				ds = append(ds, time.Since(start))
				if err := rt.Del(c); err != nil {
					t.Fatal(err)
				}
			}
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
			return ds[len(ds)/2]
		}
		done := make(chan time.Duration)
		go func() { done <- addP50() }()
		storm(t, 20, 2*time.Second)
		alone := <-done

		w := nettest.NewNode(t).WatchAsPod(t, daemonSetCaps(t), "serving /metrics", "--cache-dir", rt.CacheDir, "--metrics-addr", "127.0.0.1:0")
		m := regexp.MustCompile(`serving /metrics.* addr=(\S+)`).FindStringSubmatch(w.Text())
		if m == nil {
			t.Fatalf("no metrics address:\n%s", w.Text())
		}
		metrics := "http://" + m[1] + "/metrics"
		time.Sleep(1500 * time.Millisecond) // the start's pass, and the one after the ADD's and DEL's events
		before := passes(t, metrics)
		go func() { done <- addP50() }()
		n := storm(t, 20, 3*time.Second)
		watched := <-done
		time.Sleep(1500 * time.Millisecond)
		during := passes(t, metrics) - before
		t.Logf("%d commits to another table in 3 s beside 20 ADDs and DELs: %d passes (the runtime's verbs change the nat table)", n, during)
		t.Logf("ADD p50 beside the storm: %s with the agent watching, %s without (%.2fx)", watched.Round(10*time.Microsecond),
			alone.Round(10*time.Microsecond), float64(watched)/float64(alone))

		before = passes(t, metrics)
		storm(t, 20, 3*time.Second)
		time.Sleep(1500 * time.Millisecond)
		if got := passes(t, metrics) - before; got != 0 {
			t.Errorf("%d passes after 3 s of another table's commits alone, want none", got)
		}
		if _, nft := nettest.IptablesRelease(t); nft {
			before = passes(t, metrics)
			n = kubeProxyChurn(t, 20, 3*time.Second)
			time.Sleep(1500 * time.Millisecond)
			if got := passes(t, metrics) - before; got != 0 {
				t.Errorf("%d passes after 3 s of kube-proxy's iptables-mode commits (%d) to its own chains, want none", got, n)
			} else {
				t.Logf("%d commits of kube-proxy's iptables mode to its chains in 3 s: no pass", n)
			}
		}
		before = passes(t, metrics)
		nettest.Run(t, "iptables", "-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "storm-test", "-j", "RETURN")
		t.Cleanup(func() {
			_ = exec.Command("iptables", "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment", "storm-test", "-j", "RETURN").Run()
		})
		if !nettest.Eventually(3*time.Second, func() bool { return passes(t, metrics) > before }) {
			t.Error("no pass after a change to the nat table's POSTROUTING: the agent does not wake for the chains that jump to its own")
		}
	})
}
