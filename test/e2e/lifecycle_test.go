package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

// TestGC: three containers on network A and one on network B (with the
// container ID of one of A's); GC of A with one valid attachment removes
// exactly A's two others, and everything else still forwards.
func TestGC(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		cl := client(t)
		netA := nettest.NewRuntime(t, nettest.Net{Name: "gca", CNIVersion: "1.1.0", V4: "192.0.2.0/27", Extra: extra})
		netB := nettest.NewRuntime(t, nettest.Net{Name: "gcb", CNIVersion: "1.1.0", V4: "192.0.2.32/27", Extra: extra})
		ports := map[string]int{"a1": 7501, "a2": 7502, "a3": 7503}
		for id, port := range ports {
			c := netA.MustAdd(t, id, nettest.Mapping{HostPort: port, ContainerPort: srvPort})
			nettest.Serve(t, c.NS, "A-"+id, srvPort)
		}
		cb := netB.MustAdd(t, "a2", nettest.Mapping{HostPort: 7504, ContainerPort: srvPort})
		nettest.Serve(t, cb.NS, "B-a2", srvPort)
		for id, port := range ports {
			expectReply(t, cl, "tcp", addr(nodeIP, port), "A-"+id, clientIP)
		}

		err := netA.CNI.GCNetworkList(t.Context(), netA.List, &libcni.GCArgs{
			ValidAttachments: []types.GCAttachment{{ContainerID: "a1", IfName: "eth0"}}})
		if err != nil {
			t.Fatalf("GC: %v", err)
		}
		expectReply(t, cl, "tcp", addr(nodeIP, 7501), "A-a1", clientIP)
		expectNoReply(t, cl, "tcp", addr(nodeIP, 7502))
		expectNoReply(t, cl, "tcp", addr(nodeIP, 7503))
		expectReply(t, cl, "tcp", addr(nodeIP, 7504), "B-a2", clientIP)
		rules := b.ruleset(t)
		for _, gone := range []plan.Owner{{Network: "gca", ContainerID: "a2", IfName: "eth0"}, {Network: "gca", ContainerID: "a3", IfName: "eth0"}} {
			if strings.Contains(rules, b.chain(gone)) {
				t.Errorf("GC left %s's chain %s", gone.ContainerID, b.chain(gone))
			}
		}
		for _, kept := range []plan.Owner{{Network: "gca", ContainerID: "a1", IfName: "eth0"}, {Network: "gcb", ContainerID: "a2", IfName: "eth0"}} {
			if !strings.Contains(rules, b.chain(kept)) {
				t.Errorf("GC removed %s/%s's chain", kept.Network, kept.ContainerID)
			}
		}
	})
}

// TestStatus: STATUS succeeds with a working backend, and answers code 50
// when the backend's tool is not on PATH, or without CAP_NET_ADMIN (an
// unprivileged user).
func TestStatus(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		rt := nettest.NewRuntime(t, nettest.Net{Name: "status", CNIVersion: "1.1.0", V4: "192.0.2.64/27", Extra: extra})
		if err := rt.CNI.GetStatusNetworkList(t.Context(), rt.List); err != nil {
			t.Errorf("STATUS: %v", err)
		}
		conf := nettest.PortmapConf("status", b.name, nil)
		conf["cniVersion"] = "1.1.0"
		stdin, _ := json.Marshal(conf)
		status := func(env string, cred *syscall.Credential) ([]byte, error) {
			cmd := exec.Command(filepath.Join(nettest.BinDir(), "portmap"))
			// The last PATH in the list is the one the plugin gets.
			cmd.Env = append(nettest.PluginEnv("STATUS", "", "", nettest.BinDir()), env)
			cmd.Stdin = bytes.NewReader(stdin)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
			return cmd.Output()
		}
		// iptables needs its tools; nftables speaks netlink and needs no
		// program, only the right to change nf_tables (CAP_NET_ADMIN),
		// which an unprivileged user lacks.
		out, err := status("PATH="+t.TempDir(), nil)
		if b.name == "nftables" {
			if err != nil {
				t.Errorf("nftables STATUS with an empty PATH: %v %s, want ready (no process needed)", err, out)
			}
		} else {
			expect50(t, "with the tools off PATH", out, err, b.name)
		}
		out, err = status("PATH="+os.Getenv("PATH"), &syscall.Credential{Uid: 65534, Gid: 65534})
		expect50(t, "without CAP_NET_ADMIN", out, err, b.name)
	})
}

// expect50 wants STATUS's output to be code 50 naming the backend.
func expect50(t *testing.T, when string, out []byte, err error, backend string) {
	t.Helper()
	if err == nil {
		t.Errorf("STATUS %s succeeded: %s", when, out)
		return
	}
	var e types.Error
	if jerr := json.Unmarshal(out, &e); jerr != nil || e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Msg, backend+" backend cannot serve ADD") {
		t.Errorf("STATUS %s: %s, want code 50 naming the backend", when, out)
	}
}

// TestStatusAfterFlush: STATUS follows the spec — zero whenever ADD can
// be served — also when a firewall flush took the shared rules from an
// attachment with host ports: ADD re-creates them, and containerd would
// report the node's network not ready for any error. The lost attachment
// shows where it belongs: its CHECK fails, `portmap-agent sync --dry-run` would
// repair it, and `portmap-agent sync` does.
func TestStatusAfterFlush(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		nettest.ResetNAT(t)
		cache := t.TempDir()
		extra["cniCacheDir"] = strconv.Quote(cache)
		rt := nettest.NewRuntimeWithCache(t, nettest.Net{Name: "status51", CNIVersion: "1.1.0", V4: "192.0.2.96/28",
			V6: "2001:db8:1:51::/64", Extra: extra}, cache)
		status := func() error { return rt.CNI.GetStatusNetworkList(t.Context(), rt.List) }
		flush := func() { b.flushFirewall(t) }
		if err := status(); err != nil {
			t.Errorf("STATUS on an empty node: %v", err)
		}
		flush()
		if err := status(); err != nil {
			t.Errorf("STATUS on an empty flushed node: %v", err)
		}
		c := rt.MustAdd(t, "s1", nettest.Mapping{HostPort: 6151, ContainerPort: srvPort})
		if err := status(); err != nil {
			t.Errorf("STATUS after ADD: %v", err)
		}
		flush()
		if err := status(); err != nil {
			t.Errorf("STATUS after %q with an attachment: %v, want nil (ADD can be served)", b.flush, err)
		}
		if err := rt.Check(c); err == nil {
			t.Errorf("CHECK of the attachment after %q passed, want it to say what is missing", b.flush)
		}
		if r, code := runSync(t, "--cache-dir", cache, "--dry-run"); code != 0 || states(r)["status51/s1"] != "would repair" {
			t.Errorf("sync --dry-run: exit %d, %+v, want s1 to be repaired", code, r)
		}
		if r, code := runSync(t, "--cache-dir", cache); code != 0 || states(r)["status51/s1"] != "repaired" {
			t.Errorf("sync: exit %d, %+v", code, r)
		}
		if err := rt.Check(c); err != nil {
			t.Errorf("CHECK after sync: %v", err)
		}
		if err := status(); err != nil {
			t.Errorf("STATUS after sync: %v", err)
		}
		// A second ADD after a flush works, as STATUS promised: its host
		// port answers and CHECK passes (iptables -t nat -F leaves every
		// chain, the fast path's marker too, and empties the built-in
		// ones: ADD must make their jumps again).
		flush()
		c2 := rt.MustAdd(t, "s2", nettest.Mapping{HostPort: 6152, ContainerPort: srvPort})
		nettest.Serve(t, c2.NS, "s2", srvPort)
		expectReply(t, client(t), "tcp", addr(nodeIP, 6152), "s2", clientIP)
		if err := rt.Check(c2); err != nil {
			t.Errorf("CHECK of an ADD after %q: %v", b.flush, err)
		}
	})
}
