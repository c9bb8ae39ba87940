package e2e

import (
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/test/nettest"
)

// TestHostPortConflictReject: with "reject", a host port another
// container holds, or a host process listens on, fails ADD with code 101
// and changes nothing; another protocol or another specific host IP is no
// conflict.
func TestHostPortConflictReject(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend, extra map[string]string) {
		cl := client(t)
		nettest.AddHostAddr(t, "pmcl0", nodeIP2+"/24")
		extra["hostPortConflict"] = `"reject"`
		rt := nettest.NewRuntime(t, nettest.Net{Name: "conflict", V4: "192.0.2.0/27", Extra: extra})
		a := rt.MustAdd(t, "a", nettest.Mapping{HostPort: 7600, ContainerPort: srvPort},
			nettest.Mapping{HostPort: 7602, ContainerPort: srvPort, HostIP: nodeIP})
		nettest.Serve(t, a.NS, "a", srvPort)
		before := b.ruleset(t)

		c, err := rt.Add(t, "b", nettest.Mapping{HostPort: 7600, ContainerPort: srvPort})
		var te *types.Error
		if !errors.As(err, &te) || te.Code != 101 || !strings.Contains(te.Msg, `host port *:7600/tcp is already mapped by network "conflict" container "a"`) {
			t.Errorf("ADD b on a's port: %v, want code 101 naming a", err)
		}
		_ = rt.Del(c)
		if after := b.ruleset(t); after != before {
			t.Errorf("rejected ADD changed the ruleset:\n--- before\n%s\n--- after\n%s", before, after)
		}
		expectReply(t, cl, "tcp", addr(nodeIP, 7600), "a", clientIP)

		rt.MustAdd(t, "udp", nettest.Mapping{HostPort: 7600, ContainerPort: srvPort, Protocol: "udp"})
		rt.MustAdd(t, "other-ip", nettest.Mapping{HostPort: 7602, ContainerPort: srvPort, HostIP: nodeIP2})

		ln, err := net.Listen("tcp", "0.0.0.0:7603")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err = rt.Add(t, "busy", nettest.Mapping{HostPort: 7603, ContainerPort: srvPort})
		if !errors.As(err, &te) || te.Code != 101 || !strings.Contains(te.Msg, "a process on the host listens on ") || !strings.Contains(te.Msg, ":7603") {
			t.Errorf("ADD on a port a host process listens on: %v, want code 101", err)
		}
		_ = rt.Del(c)
	})
}

// TestList: `portmap-agent list --json` shows what both backends and the
// upstream plugin mapped, and the table has one row each.
func TestList(t *testing.T) {
	nettest.ResetNAT(t)
	ipt := nettest.NewRuntime(t, nettest.Net{Name: "list-ipt", V4: "192.0.2.0/28", Extra: map[string]string{"backend": `"iptables"`}})
	nft := nettest.NewRuntime(t, nettest.Net{Name: "list-nft", V4: "192.0.2.16/28", V6: "2001:db8:1:50::/64", Extra: map[string]string{"backend": `"nftables"`}})
	up := nettest.NewRuntime(t, nettest.Net{Name: "list-up", V4: "192.0.2.32/28", Portmap: "portmap-upstream"})
	ci := ipt.MustAdd(t, "ci", nettest.Mapping{HostPort: 7701, ContainerPort: 81, HostIP: nodeIP})
	cn := nft.MustAdd(t, "cn", nettest.Mapping{HostPort: 7702, ContainerPort: 82, Protocol: "udp"})
	cu := up.MustAdd(t, "cu", nettest.Mapping{HostPort: 7703, ContainerPort: 83, Protocol: "tcp"})

	out, err := exec.Command(filepath.Join(nettest.BinDir(), "portmap-agent"), "list", "--json").Output()
	if err != nil {
		t.Fatalf("portmap-agent list --json: %v", err)
	}
	var got []inventory.Entry
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("list --json is not JSON: %v\n%s", err, out)
	}
	want := []inventory.Entry{
		{HostIP: nodeIP, HostPort: 7701, Protocol: "tcp", ContainerIP: ci.IP(4), ContainerPort: 81, Network: "list-ipt", ContainerID: "ci", Backend: "iptables"},
		{HostIP: "*", HostPort: 7702, Protocol: "udp", ContainerIP: cn.IP(4), ContainerPort: 82, Network: "list-nft", ContainerID: "cn", Backend: "nftables"},
		{HostIP: "*", HostPort: 7702, Protocol: "udp", ContainerIP: cn.IP(6), ContainerPort: 82, Network: "list-nft", ContainerID: "cn", Backend: "nftables"},
		{HostIP: "*", HostPort: 7703, Protocol: "tcp", ContainerIP: cu.IP(4), ContainerPort: 83, Network: "list-up", ContainerID: "cu", Backend: "iptables"},
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			t.Errorf("list --json lacks %+v; it has %+v", w, got)
		}
	}
	table, err := exec.Command(filepath.Join(nettest.BinDir(), "portmap-agent"), "list").Output()
	if err != nil {
		t.Fatalf("portmap-agent list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(table)), "\n")
	if len(lines) != len(got)+1 || !strings.HasPrefix(lines[0], "HOST IP") {
		t.Errorf("portmap-agent list has %d lines for %d entries:\n%s", len(lines), len(got), table)
	}
}
