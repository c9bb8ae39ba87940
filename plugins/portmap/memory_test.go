package portmap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
)

// mapped is what a read of the kernel shows forwarded, both families,
// sorted: "tcp 8080 -> 192.0.2.2:80 c1".
func mapped(t *testing.T, k fakehost.InMemory) []string {
	return k.Mapped(t, func(m plan.Installed) string {
		return fmt.Sprintf("%s %d -> %s c=%s", m.Protocol, m.HostPort, joinHostPort(m.ContainerIP.String(), m.ContainerPort), m.Owner.ContainerID)
	})
}

// jsonOf decodes a JSON object.
func jsonOf(t *testing.T, s string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func joinHostPort(ip string, port int) string {
	if strings.Contains(ip, ":") {
		return fmt.Sprintf("[%s]:%d", ip, port)
	}
	return fmt.Sprintf("%s:%d", ip, port)
}

// TestOverMemory: the verbs and the agent's passes on each real backend
// over its kernel in memory (nf_tables; iptables' and ip6tables'
// x_tables), judged by what a read of the kernel shows and where its
// tracer sends a connection — not by calls. ADD maps both families
// (hairpin masqueraded); a firewall flush breaks forwarding and CHECK,
// and a pass brings back exactly what ADD wrote; a newer ADD of the same
// port takes its traffic (CHECK of the older names the port where the
// newer took its one map element; where rules stack, the older's stay
// and take the port back at the newer's DEL), and after the newer one's
// DEL a pass gives it back; a pruning pass keeps an attachment the cache
// lacks while its namespace lives and removes it once gone; GC keeps a
// valid attachment and removes one that is not; DEL leaves no rule and
// repeats; STATUS follows the kernel's answer to a write.
func TestOverMemory(t *testing.T) {
	for _, be := range []string{"nftables", "iptables"} {
		t.Run(be, func(t *testing.T) { overMemory(t, be) })
	}
}

func overMemory(t *testing.T, be string) {
	h, _ := fakehost.New()
	k := fakehost.BackendsInMemory(h)[backend.Name(be)]
	p := &Plugin{Stdout: &bytes.Buffer{}, Host: h}
	dir := t.TempDir()
	nft := func(prev string, extra map[string]string) map[string]string {
		m := withMappings(map[string]string{"backend": strconv.Quote(be), "prevResult": prev})
		for key, v := range extra {
			m[key] = v
		}
		return m
	}
	cmd := func(id string, conf map[string]string) *skel.CmdArgs {
		a := args(t, conf)
		a.ContainerID = id
		if id != "c1" {
			a.Netns = "/run/netns/" + id
		}
		return a
	}
	// to is where the kernel sends a connection from src to the host's
	// address of family f, port port, by the tracer of the kernel in
	// memory; "+masq" when it is masqueraded too.
	hostIP := map[plan.Family]net.IP{plan.IPv4: net.ParseIP("198.51.100.1").To4(), plan.IPv6: net.ParseIP("2001:db8:100::1")}
	local := func(a net.IP) bool { return a.Equal(hostIP[plan.IPv4]) || a.Equal(hostIP[plan.IPv6]) }
	to := func(f plan.Family, src string, proto plan.Protocol, port int) string {
		t.Helper()
		v, err := k.Trace(f, plan.Packet{Protocol: proto, Src: net.ParseIP(src), Dst: hostIP[f], Dport: port}, local)
		if err != nil {
			t.Fatal(err)
		}
		if v.Masquerade {
			return v.DNAT + "+masq"
		}
		return v.DNAT
	}
	const remote, remote6 = "203.0.113.9", "2001:db8:9::9"
	c1 := nft(prevDual, nil)
	if err := p.Add(cmd("c1", c1)); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		f     plan.Family
		src   string
		proto plan.Protocol
		port  int
		want  string
	}{
		{plan.IPv4, remote, plan.TCP, 8080, "192.0.2.2:80"},
		{plan.IPv4, remote, plan.UDP, 8053, "192.0.2.2:53"},
		{plan.IPv4, "192.0.2.2", plan.TCP, 8080, "192.0.2.2:80+masq"}, // hairpin
		{plan.IPv4, remote, plan.TCP, 8081, ""},
		{plan.IPv6, remote6, plan.TCP, 8080, "[2001:db8::2]:80"},
	} {
		if got := to(tt.f, tt.src, tt.proto, tt.port); got != tt.want {
			t.Errorf("after ADD, %s %s from %s to %d: %q, want %q", tt.f, tt.proto, tt.src, tt.port, got, tt.want)
		}
	}
	want := []string{"tcp 8080 -> 192.0.2.2:80 c=c1", "tcp 8080 -> [2001:db8::2]:80 c=c1",
		"udp 8053 -> 192.0.2.2:53 c=c1", "udp 8053 -> [2001:db8::2]:53 c=c1"}
	if got := mapped(t, k); !slices.Equal(got, want) {
		t.Fatalf("after ADD: %q, want %q", got, want)
	}
	if err := p.Check(cmd("c1", c1)); err != nil {
		t.Errorf("CHECK after ADD: %v", err)
	}

	// A firewall flush, then a pass of the agent from libcni's cache.
	conflist := `{"cniVersion":"1.0.0","name":"net1","plugins":[{"type":"ptp"},{"type":"portmap","backend":"` + be + `","capabilities":{"portMappings":true}}]}`
	if err := cnicache.Write(dir, cnicache.Entry{Network: "net1", ContainerID: "c1", IfName: "eth0", Conflist: []byte(conflist),
		CapabilityArgs: map[string]any{"portMappings": []any{
			map[string]any{"hostPort": 8080, "containerPort": 80},
			map[string]any{"hostPort": 8053, "containerPort": 53, "protocol": "udp"}}},
		Result: jsonOf(t, prevDual)}); err != nil {
		t.Fatal(err)
	}
	added := k.Ruleset()
	k.Flush()
	if got := mapped(t, k); len(got) != 0 || to(plan.IPv4, remote, plan.TCP, 8080) != "" {
		t.Fatalf("after the flush: %q", got)
	}
	if err := p.Check(cmd("c1", c1)); err == nil {
		t.Error("CHECK after a flush passed")
	}
	live := map[string]bool{"/run/netns/c": true}
	ag := &agent.Agent{Host: h, Gone: func(ns string) bool { return !live[ns] }}
	if _, err := ag.Sync(agent.Options{CacheDir: dir}); err != nil {
		t.Fatal(err)
	}
	if got := mapped(t, k); !slices.Equal(got, want) {
		t.Fatalf("after the agent's pass: %q, want %q", got, want)
	}
	if got := to(plan.IPv4, remote, plan.TCP, 8080); got != "192.0.2.2:80" {
		t.Errorf("after the agent's pass, 8080 goes to %q", got)
	}
	if got := k.Ruleset(); got != added {
		t.Errorf("after the agent's pass:\n%s\nwant what ADD wrote:\n%s", got, added)
	}
	if err := p.Check(cmd("c1", c1)); err != nil {
		t.Errorf("CHECK after the agent's pass: %v", err)
	}

	// c2 takes 8080 (IPv4 only); c1 keeps its other ports.
	prev2 := `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c2"}],"ips":[{"address":"192.0.2.3/24","interface":0}]}`
	c2 := nft(prev2, map[string]string{"runtimeConfig": `{"portMappings":[{"hostPort":8080,"containerPort":8080}]}`})
	live["/run/netns/c2"] = true
	if err := p.Add(cmd("c2", c2)); err != nil {
		t.Fatal(err)
	}
	want = []string{"tcp 8080 -> 192.0.2.3:8080 c=c2", "tcp 8080 -> [2001:db8::2]:80 c=c1",
		"udp 8053 -> 192.0.2.2:53 c=c1", "udp 8053 -> [2001:db8::2]:53 c=c1"}
	if k.Stacks {
		want = append([]string{"tcp 8080 -> 192.0.2.2:80 c=c1"}, want...)
	}
	if got := mapped(t, k); !slices.Equal(got, want) {
		t.Fatalf("after c2's ADD: %q, want %q", got, want)
	}
	// the newest ADD wins the port, whether its rules stack or not
	if got, got6 := to(plan.IPv4, remote, plan.TCP, 8080), to(plan.IPv6, remote6, plan.TCP, 8080); got != "192.0.2.3:8080" || got6 != "[2001:db8::2]:80" {
		t.Errorf("after c2's ADD, 8080 goes to %q (IPv6 %q), want c2's (c1's)", got, got6)
	}
	if err := p.Check(cmd("c1", c1)); k.Stacks && err != nil {
		t.Errorf("CHECK of c1 under c2's rules: %v", err)
	} else if !k.Stacks && (err == nil || !strings.Contains(err.Error(), "8080")) {
		t.Errorf("CHECK of c1 after c2 took 8080: %v, want the port named", err)
	}

	// c2's DEL leaves 8080 to c1's rules where they stacked, else to
	// nobody; a pass gives it back to c1, the cache's claimant.
	if err := p.Del(cmd("c2", c2)); err != nil {
		t.Fatal(err)
	}
	if got := mapped(t, k); slices.Contains(got, "tcp 8080 -> 192.0.2.2:80 c=c1") != k.Stacks ||
		slices.Contains(got, "tcp 8080 -> 192.0.2.3:8080 c=c2") {
		t.Errorf("after c2's DEL: %q", got)
	}
	if got, want := to(plan.IPv4, remote, plan.TCP, 8080), map[bool]string{true: "192.0.2.2:80"}[k.Stacks]; got != want {
		t.Errorf("after c2's DEL, 8080 goes to %q, want %q", got, want)
	}
	if _, err := ag.Sync(agent.Options{CacheDir: dir}); err != nil {
		t.Fatal(err)
	}
	if got := mapped(t, k); !slices.Contains(got, "tcp 8080 -> 192.0.2.2:80 c=c1") {
		t.Errorf("after a pass: %q, want 8080 back with c1", got)
	}
	if got := to(plan.IPv4, remote, plan.TCP, 8080); got != "192.0.2.2:80" {
		t.Errorf("after a pass, 8080 goes to %q, want c1's", got)
	}

	// A pruning pass: c3 is in no cache entry, but its ADD is on record
	// and its namespace lives, so its rules stay; gone, they go.
	prev3 := `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c3"}],"ips":[{"address":"192.0.2.4/24","interface":0}]}`
	c3 := nft(prev3, map[string]string{"runtimeConfig": `{"portMappings":[{"hostPort":9090,"containerPort":80}]}`})
	live["/run/netns/c3"] = true
	if err := p.Add(cmd("c3", c3)); err != nil {
		t.Fatal(err)
	}
	if _, err := ag.Sync(agent.Options{CacheDir: dir, Prune: true}); err != nil {
		t.Fatal(err)
	}
	if got := mapped(t, k); !slices.Contains(got, "tcp 9090 -> 192.0.2.4:80 c=c3") {
		t.Errorf("a pruning pass took a live attachment's port: %q", got)
	}
	delete(live, "/run/netns/c3")
	if _, err := ag.Sync(agent.Options{CacheDir: dir, Prune: true}); err != nil {
		t.Fatal(err)
	}
	if got := mapped(t, k); slices.ContainsFunc(got, func(s string) bool { return strings.HasSuffix(s, "c=c3") }) {
		t.Errorf("c3's rules after its namespace went: %q", got)
	}

	// GC with c1 alone valid keeps c1; with none, removes it.
	gc := func(valid string) error {
		return p.GC(args(t, map[string]string{"cniVersion": `"1.1.0"`, "backend": strconv.Quote(be), "cni.dev/valid-attachments": valid}))
	}
	if err := gc(`[{"containerID":"c1","ifname":"eth0"}]`); err != nil {
		t.Fatal(err)
	}
	if got := mapped(t, k); len(got) == 0 {
		t.Error("GC removed a valid attachment")
	}
	if err := p.Del(cmd("c1", c1)); err != nil {
		t.Fatal(err)
	}
	if got := mapped(t, k); len(got) != 0 {
		t.Errorf("after DEL: %q", got)
	}
	if got := to(plan.IPv4, remote, plan.TCP, 8080); got != "" {
		t.Errorf("after DEL, 8080 goes to %q", got)
	}
	if err := p.Del(cmd("c1", c1)); err != nil {
		t.Errorf("a second DEL: %v", err)
	}
	if err := p.Add(cmd("c1", c1)); err != nil {
		t.Fatal(err)
	}
	if err := gc(`[{"containerID":"other","ifname":"eth0"}]`); err != nil {
		t.Fatal(err)
	}
	if got := mapped(t, k); len(got) != 0 {
		t.Errorf("after GC with c1 not valid: %q", got)
	}

	status := func() error {
		return p.Status(args(t, map[string]string{"cniVersion": `"1.1.0"`, "backend": strconv.Quote(be)}))
	}
	if err := status(); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	k.Flush() // no skeleton to read: STATUS asks for a write
	k.Refuse(errors.New("operation not permitted"))
	if err := status(); codeOf(err) != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), "operation not permitted") {
		t.Errorf("STATUS when the kernel refuses a write: %v, want code 50 with the reason", err)
	}
	k.Refuse(nil)
	if err := status(); err != nil {
		t.Errorf("STATUS when the kernel takes a write again: %v", err)
	}
}
