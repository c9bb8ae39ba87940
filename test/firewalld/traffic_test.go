//go:build firewalld

package firewalld

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/portmap-dev/portmap/test/nettest"
	"golang.org/x/sys/unix"
)

// TestDefaults: under firewalld as Debian ships it (the LAN interface in
// the default zone, public), with each of its backends and each of ours,
// a container's host port answers from a client on the LAN, from the
// node's address and from 127.0.0.1.
func TestDefaults(t *testing.T) {
	for _, r := range releases {
		for _, fw := range []string{"nftables", "iptables"} {
			for _, ours := range []string{"iptables", "nftables"} {
				t.Run(r.name+"/"+fw+"/"+ours, func(t *testing.T) {
					startFirewalld(t, r.suite, fw)
					cl := nettest.NewClient(t, clientNet)
					node := cl.HostIP[0].String()
					rt := nettest.NewRuntime(t, nettest.Net{Name: "fw", V4: "192.0.2.0/28", Extra: map[string]string{"backend": `"` + ours + `"`}})
					c := rt.MustAdd(t, "c1", nettest.Mapping{HostPort: hostPort, ContainerPort: srvPort})
					nettest.Serve(t, c.NS, "c1", srvPort)
					// firewalld filters: a port of the node's own that the
					// default zone does not open is not reached from the LAN
					self, err := ns.GetCurrentNS()
					if err != nil {
						t.Fatal(err)
					}
					defer self.Close()
					nettest.Serve(t, self, "node", nodePort)
					if got, err := dial(cl, "tcp", addr(node, nodePort)); err == nil {
						t.Errorf("the node's port %d answered the LAN (%q) under firewalld's default zone", nodePort, got)
					}
					for _, x := range []struct {
						from *nettest.Client
						addr string
					}{{cl, addr(node, hostPort)}, {nil, addr(node, hostPort)}, {nil, addr("127.0.0.1", hostPort)}} {
						got, err := dial(x.from, "tcp", x.addr)
						if err != nil || !strings.HasPrefix(got, "c1 sees") {
							t.Errorf("tcp %s: %q %v", x.addr, got, err)
						}
					}
				})
			}
		}
	}
}

func dial(from *nettest.Client, proto, addr string) (string, error) {
	if from == nil {
		return nettest.Dial(nil, proto, addr)
	}
	return nettest.Dial(from.NS, proto, addr)
}

// TestReload: `firewall-cmd --reload` and `--complete-reload` with each
// of firewalld's backends and ours. Where the reload flushes the iptables
// tables (firewalld's iptables backend; 1.3 with its nftables backend
// too) the host port of our iptables backend stops answering until
// `portmap-agent sync` repairs it; our nftables backend's table is its
// own, and every release leaves it. With the agent watching
// (`sync --watch`), the host port answers again after every reload.
func TestReload(t *testing.T) {
	for _, r := range releases {
		for _, fw := range []string{"nftables", "iptables"} {
			for _, ours := range []string{"iptables", "nftables"} {
				flushed := ours == "iptables" && (fw == "iptables" || r.suite == "bookworm")
				t.Run(r.name+"/"+fw+"/"+ours, func(t *testing.T) { reload(t, r.suite, fw, ours, flushed) })
			}
		}
	}
}

func reload(t *testing.T, suite, fw, ours string, flushed bool) {
	f := startFirewalld(t, suite, fw)
	cl := nettest.NewClient(t, clientNet)
	at := addr(cl.HostIP[0].String(), hostPort)
	rt := nettest.NewRuntime(t, nettest.Net{Name: "fw", V4: "192.0.2.0/28", Extra: map[string]string{"backend": `"` + ours + `"`}})
	c := rt.MustAdd(t, "c1", nettest.Mapping{HostPort: hostPort, ContainerPort: srvPort})
	nettest.Serve(t, c.NS, "c1", srvPort)
	want := "c1 sees " + cl.IP[0].String()
	for _, how := range []string{"--reload", "--complete-reload"} {
		if out, err := f.cmd(how); err != nil {
			t.Fatalf("firewall-cmd %s: %v %s", how, err, out)
		}
		got, err := dial(cl, "tcp", at)
		if answered := err == nil && got == want; answered == flushed {
			t.Errorf("after %s: %q %v; want the host port flushed: %v", how, got, err, flushed)
		}
		out, stderr, status, err := nettest.Agent("sync", "--cache-dir", rt.CacheDir)
		wantSync := "1 ok, 0 repaired"
		if flushed {
			wantSync = "0 ok, 1 repaired"
		}
		if err != nil || status != 0 || !strings.Contains(out, wantSync) {
			t.Errorf("portmap-agent sync after %s: exit %d %v, want %q\n%s%s", how, status, err, wantSync, out, stderr)
		}
		if got, err := dial(cl, "tcp", at); err != nil || got != want {
			t.Errorf("after %s and sync: %q %v", how, got, err)
		}
	}

	// the agent watching: each reload repaired
	log := startAgent(t, rt.CacheDir)
	for _, how := range []string{"--reload", "--complete-reload"} {
		if out, err := f.cmd(how); err != nil {
			t.Fatalf("firewall-cmd %s: %v %s", how, err, out)
		}
		start := time.Now()
		var got string
		if !nettest.Eventually(5*time.Second, func() bool { got, _ = dial(cl, "tcp", at); return got == want }) {
			t.Errorf("with the agent, 5 s after %s: %q", how, got)
		}
		took := time.Since(start)
		t.Logf("%s %s, ours %s: the host port answered %s after firewall-cmd %s returned", suite, fw, ours, took.Round(10*time.Millisecond), how)
		if took > 500*time.Millisecond {
			t.Errorf("with the agent, the host port answered %s after firewall-cmd %s returned, want within 0.5 s", took, how)
		}
	}
	// both reloads seen on the bus, and no pass failed during one
	if n := strings.Count(log(), "firewalld reloaded"); n != 2 || strings.Contains(log(), "level=ERROR") {
		t.Errorf("the agent's log: %d reloads seen, want 2, and no error:\n%s", n, log())
	}
}

// TestRestart: firewalld stopped and started again (as `systemctl
// restart firewalld` does) writes its rules anew, and, with its iptables
// backend or as 1.3, flushes the iptables tables as it goes and comes.
// The agent follows its start on the bus: our iptables backend's host
// port answers again within 0.5 s of firewalld running, and a start with
// StrictForwardPorts on is warned of as a reload is.
func TestRestart(t *testing.T) {
	for _, r := range releases {
		for _, fw := range []string{"nftables", "iptables"} {
			t.Run(r.name+"/"+fw, func(t *testing.T) {
				f := startFirewalld(t, r.suite, fw)
				cl := nettest.NewClient(t, clientNet)
				at := addr(cl.HostIP[0].String(), hostPort)
				rt := nettest.NewRuntime(t, nettest.Net{Name: "fw", V4: "192.0.2.0/28", Extra: map[string]string{"backend": `"iptables"`}})
				c := rt.MustAdd(t, "c1", nettest.Mapping{HostPort: hostPort, ContainerPort: srvPort})
				nettest.Serve(t, c.NS, "c1", srvPort)
				log := startAgent(t, rt.CacheDir)
				answers := func() bool { got, err := dial(cl, "tcp", at); return err == nil && strings.HasPrefix(got, "c1 sees") }

				f.stop()
				f.start(t)
				start := time.Now()
				if !nettest.Eventually(5*time.Second, answers) {
					t.Fatal("the host port does not answer 5 s after firewalld's restart")
				}
				took := time.Since(start)
				t.Logf("%s %s: the host port answered %s after firewalld ran again", r.suite, fw, took.Round(10*time.Millisecond))
				if took > 500*time.Millisecond {
					t.Errorf("the host port answered %s after firewalld ran again, want within 0.5 s", took)
				}
				if !strings.Contains(log(), `msg="firewalld started"`) || strings.Contains(log(), "level=ERROR") {
					t.Errorf("the agent's log: want firewalld's start seen and no error:\n%s", log())
				}
				if r.suite != "trixie" {
					return
				}
				f.configure(t, "StrictForwardPorts=yes")
				f.stop()
				f.start(t)
				if !nettest.Eventually(5*time.Second, func() bool {
					return strings.Contains(log(), "firewalld's StrictForwardPorts drops these host ports") && strings.Contains(log(), "container="+c.ID)
				}) {
					t.Errorf("the agent did not name the dropped host ports 5 s after a start with StrictForwardPorts=yes:\n%s", log())
				}
			})
		}
	}
}

// TestStrictForwardPorts: firewalld 2.3 with StrictForwardPorts=yes drops
// the connections other software DNATs to containers. ADD with host
// ports fails there with code 50 naming the setting and writes nothing;
// ADD without host ports, DEL, GC and STATUS answer as usual. (With it
// off, as shipped, TestDefaults' host ports answer; firewalld 1.3 has no
// such setting.)
func TestStrictForwardPorts(t *testing.T) {
	for _, fw := range []string{"nftables", "iptables"} {
		for _, ours := range []string{"iptables", "nftables"} {
			t.Run(fw+"/"+ours, func(t *testing.T) {
				startFirewalld(t, "trixie", fw, "StrictForwardPorts=yes")
				rt := nettest.NewRuntime(t, nettest.Net{Name: "fw", CNIVersion: "1.1.0", V4: "192.0.2.0/28",
					Extra: map[string]string{"backend": `"` + ours + `"`}})
				c, err := rt.Add(t, "c1", nettest.Mapping{HostPort: hostPort, ContainerPort: srvPort})
				if nettest.Code(err) != 50 || !strings.Contains(fmt.Sprint(err), "StrictForwardPorts is on") || !strings.Contains(fmt.Sprint(err), "8080/tcp") {
					t.Errorf("ADD with a host port under StrictForwardPorts=yes: %v (code %d), want code 50 naming the setting and the port", err, nettest.Code(err))
				}
				if out, stderr, status, err := nettest.Agent("list", "--json"); err != nil || status != 0 || strings.TrimSpace(out) != "[]" {
					t.Errorf("portmap-agent list after the refused ADD: exit %d %v %q %s, want no mapping", status, err, out, stderr)
				}
				if err := rt.Del(c); err != nil {
					t.Errorf("DEL of the refused attachment: %v", err)
				}
				// a runtime that cannot reach the bus: firewalld.conf says
				t.Run("without the bus", func(t *testing.T) {
					t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/run/portmap-no-bus")
					c, err := rt.Add(t, "c3", nettest.Mapping{HostPort: hostPort, ContainerPort: srvPort})
					if nettest.Code(err) != 50 || !strings.Contains(fmt.Sprint(err), "StrictForwardPorts is on") {
						t.Errorf("ADD with a host port, StrictForwardPorts=yes in firewalld.conf, no bus: %v (code %d), want code 50", err, nettest.Code(err))
					}
					if err := rt.Del(c); err != nil {
						t.Errorf("DEL of the refused attachment: %v", err)
					}
				})
				plain := rt.MustAdd(t, "c2")
				ctx := context.Background()
				if err := rt.CNI.GetStatusNetworkList(ctx, rt.List); err != nil {
					t.Errorf("STATUS: %v", err)
				}
				valid := &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: plain.ID, IfName: "eth0"}}}
				if err := rt.CNI.GCNetworkList(ctx, rt.List, valid); err != nil {
					t.Errorf("GC: %v", err)
				}
				if err := rt.Del(plain); err != nil {
					t.Errorf("DEL without host ports: %v", err)
				}
			})
		}
	}
}

// TestStrictTurnedOn: host ports made before StrictForwardPorts was
// turned on (firewalld.conf, then a reload) stop answering, the LAN and
// the node alike (firewalld checks DNATed connections on output too);
// `portmap-agent list` marks them dropped and the agent names them; once
// it is off again (and reloaded), they answer again.
func TestStrictTurnedOn(t *testing.T) {
	for _, fw := range []string{"nftables", "iptables"} {
		for _, ours := range []string{"iptables", "nftables"} {
			t.Run(fw+"/"+ours, func(t *testing.T) {
				f := startFirewalld(t, "trixie", fw)
				cl := nettest.NewClient(t, clientNet)
				node := cl.HostIP[0].String()
				rt := nettest.NewRuntime(t, nettest.Net{Name: "fw", V4: "192.0.2.0/28", Extra: map[string]string{"backend": `"` + ours + `"`}})
				c := rt.MustAdd(t, "c1", nettest.Mapping{HostPort: hostPort, ContainerPort: srvPort})
				nettest.Serve(t, c.NS, "c1", srvPort)
				log := startAgent(t, rt.CacheDir)
				answers := func(from *nettest.Client, ip string) bool {
					got, err := dial(from, "tcp", addr(ip, hostPort))
					return err == nil && strings.HasPrefix(got, "c1 sees")
				}
				if !answers(cl, node) {
					t.Fatal("the host port does not answer the LAN before StrictForwardPorts")
				}

				f.configure(t, "StrictForwardPorts=yes")
				if out, err := f.cmd("--reload"); err != nil {
					t.Fatalf("firewall-cmd --reload: %v %s", err, out)
				}
				warn := "firewalld's StrictForwardPorts drops these host ports"
				if !nettest.Eventually(5*time.Second, func() bool {
					l := log()
					return strings.Contains(l, warn) && strings.Contains(l, "container="+c.ID) && strings.Contains(l, "hostPorts=8080/tcp")
				}) {
					t.Errorf("the agent did not name the dropped host ports in 5 s:\n%s", log())
				}
				for _, x := range []struct {
					from *nettest.Client
					ip   string
				}{{cl, node}, {nil, node}, {nil, "127.0.0.1"}} {
					if answers(x.from, x.ip) {
						t.Errorf("the host port answers at %s (from the LAN: %v) under StrictForwardPorts=yes: firewalld should drop it", x.ip, x.from != nil)
					}
				}
				out, stderr, status, err := nettest.Agent("list")
				if err != nil || status != 0 || !strings.Contains(out, "DROPPED BY") || !strings.Contains(out, "firewalld StrictForwardPorts") ||
					!strings.Contains(stderr, "StrictForwardPorts is on") {
					t.Errorf("portmap-agent list: exit %d %v\n%s%s", status, err, out, stderr)
				}

				f.configure(t)
				if out, err := f.cmd("--reload"); err != nil {
					t.Fatalf("firewall-cmd --reload: %v %s", err, out)
				}
				if !nettest.Eventually(5*time.Second, func() bool { return answers(cl, node) }) {
					t.Error("the host port does not answer the LAN 5 s after StrictForwardPorts=no and a reload")
				}
				if !nettest.Eventually(5*time.Second, func() bool { return strings.Contains(log(), "StrictForwardPorts is off") }) {
					t.Errorf("the agent did not say StrictForwardPorts is off:\n%s", log())
				}
				if out, _, _, _ := nettest.Agent("list"); strings.Contains(out, "DROPPED BY") {
					t.Errorf("portmap-agent list with StrictForwardPorts off:\n%s", out)
				}
				if strings.Contains(log(), "level=ERROR") {
					t.Errorf("the agent logged an error:\n%s", log())
				}
			})
		}
	}
}

// startAgent starts `portmap-agent sync --watch` on the cache, until the
// test ends, and returns its log so far.
func startAgent(t *testing.T, cacheDir string) (log func() string) {
	t.Helper()
	log, _ = startAgentWith(t, nil, "--cache-dir", cacheDir)
	return log
}

// startAgentWith starts `portmap-agent sync --watch` with args, and env
// beside the test's, until the test ends; it returns its log so far and
// the process.
func startAgentWith(t *testing.T, env []string, args ...string) (log func() string, p *os.Process) {
	t.Helper()
	logFile := filepath.Join(t.TempDir(), "agent.log")
	out, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	log = func() string { data, _ := os.ReadFile(logFile); return string(data) }
	agent := exec.Command(filepath.Join(nettest.BinDir(), "portmap-agent"), append([]string{"sync", "--watch"}, args...)...)
	agent.Stdout, agent.Stderr = out, out
	agent.Env = append(os.Environ(), env...)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agent.Process.Signal(unix.SIGTERM)
		_ = agent.Wait()
		out.Close()
		if t.Failed() {
			t.Logf("the agent's log:\n%s", log())
		}
	})
	// watching, and following firewalld on the bus or not (it finds the
	// bus in the background)
	if !nettest.Eventually(10*time.Second, func() bool {
		l := log()
		return strings.Contains(l, "watching") && (strings.Contains(l, "following firewalld on the system bus") || strings.Contains(l, "no system bus"))
	}) {
		t.Fatalf("the agent did not start watching in 10 s:\n%s", log())
	}
	return log, agent.Process
}
