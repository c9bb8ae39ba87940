package portmap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/conntrack"
	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
	"github.com/portmap-dev/portmap/test/fixture"
)

func newFake() (*Plugin, *fakehost.Host, *bytes.Buffer) {
	h, fh := fakehost.New()
	out := &bytes.Buffer{}
	return &Plugin{Stdout: out, Host: h}, fh, out
}

const prevDual = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c"}],
  "ips":[{"address":"192.0.2.2/24","interface":0},{"address":"2001:db8::2/64","interface":0}]}`

var (
	conf     = fixture.Conf
	mappings = fixture.PortMappings
)

func args(t *testing.T, extra map[string]string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/c", StdinData: conf(t, extra)}
}

func withMappings(extra map[string]string) map[string]string {
	out := mappings(`[{"hostPort":8080,"containerPort":80},{"hostPort":8053,"containerPort":53,"protocol":"udp"}]`)
	for k, v := range extra {
		out[k] = v
	}
	return out
}

func codeOf(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

func TestAddAppliesBothFamiliesAndPrintsPrevResult(t *testing.T) {
	p, h, out := newFake()
	if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err != nil {
		t.Fatalf("Add: %v", err)
	}
	want := []string{
		"backend iptables ipv4",
		"backend iptables ipv6",
		"lock", // the ledger's record, before any rule
		"ledger add net1/c1/eth0",
		"apply ipv4 net1/c1/eth0 192.0.2.2 [*:8080/tcp->80 *:8053/udp->53]",
		"apply ipv6 net1/c1/eth0 2001:db8::2 [*:8080/tcp->80 *:8053/udp->53]",
		"route_localnet veth-192.0.2.2",
		"flush ipv4 udp 8053",
		"flush ipv6 udp 8053",
		"flushed", // one walk of the conntrack table for both families
	}
	if got := h.Calls(); got != strings.Join(want, "\n") {
		t.Errorf("calls:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	var printed map[string]any
	if err := json.Unmarshal(out.Bytes(), &printed); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	if printed["cniVersion"] != "1.0.0" || len(printed["ips"].([]any)) != 2 {
		t.Errorf("printed result %v, want prevResult unchanged", printed)
	}
}

func TestBackendSelection(t *testing.T) {
	p, h, _ := newFake()
	p.Host.DefaultBackend = func() backend.Name { return backend.NFTables }
	if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err != nil {
		t.Fatal(err)
	}
	if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual, "backend": `"iptables"`}))); err != nil {
		t.Fatal(err)
	}
	got := h.Calls()
	if !strings.Contains(got, "backend nftables ipv4") || !strings.Contains(got, "backend iptables ipv4") {
		t.Errorf("calls:\n%s\nwant the default (nftables) first, then the configured iptables", got)
	}
}

func TestAddPrintsInConfigVersion(t *testing.T) {
	p, _, out := newFake()
	prev := `{"cniVersion":"0.3.1","interfaces":[{"name":"eth0","sandbox":"/run/netns/c"}],"ips":[{"version":"4","address":"192.0.2.2/24","interface":0}]}`
	a := args(t, withMappings(map[string]string{"prevResult": prev, "cniVersion": `"0.3.1"`}))
	if err := p.Add(a); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if !strings.Contains(out.String(), `"cniVersion": "0.3.1"`) || !strings.Contains(out.String(), `"version": "4"`) {
		t.Errorf("result not printed as 0.3.1:\n%s", out)
	}
}

func TestAddWithoutMappingsPassesThrough(t *testing.T) {
	p, h, out := newFake()
	if err := p.Add(args(t, map[string]string{"prevResult": prevDual})); err != nil {
		t.Fatalf("Add: %v", err)
	}
	// Only the ledger's record, which DEL forgets.
	if h.Calls() != "lock\nledger add net1/c1/eth0" || !strings.Contains(out.String(), "192.0.2.2/24") {
		t.Errorf("calls %v, stdout %q: want the record only and the prevResult", h.CallList(), out)
	}
}

func TestAddRejectsBeforeTouchingAnything(t *testing.T) {
	tests := []struct {
		name  string
		extra map[string]string
		code  uint
	}{
		{"no prevResult", withMappings(nil), 7},
		{"bad port", map[string]string{"prevResult": prevDual, "runtimeConfig": `{"portMappings":[{"hostPort":70000,"containerPort":80}]}`}, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, h, out := newFake()
			err := p.Add(args(t, tt.extra))
			if codeOf(err) != tt.code {
				t.Fatalf("error %v (code %d), want code %d", err, codeOf(err), tt.code)
			}
			if h.Calls() != "" || out.Len() != 0 {
				t.Errorf("calls %v, stdout %q: want nothing", h.CallList(), out)
			}
		})
	}
}

func TestAddUndoesOnFailure(t *testing.T) {
	t.Run("second family fails", func(t *testing.T) {
		p, h, _ := newFake()
		h.FailApply["iptables ipv6"] = errors.New("kernel says no")
		err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual})))
		if err == nil || !strings.Contains(err.Error(), "iptables backend: kernel says no") {
			t.Fatalf("error %v, want the ipv6 failure", err)
		}
		if last := h.CallList()[len(h.CallList())-1]; !strings.HasPrefix(last, "remove ipv4 net1/c1/eth0 192.0.2.2") {
			t.Errorf("calls %v: want ipv4 removed last", h.CallList())
		}
	})
	t.Run("route_localnet fails", func(t *testing.T) {
		p, h, _ := newFake()
		h.FailSysctl = errors.New("read-only /proc")
		if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err == nil {
			t.Fatal("Add succeeded, want the sysctl error")
		}
		got := h.Calls()
		if !strings.Contains(got, "remove ipv4") || !strings.Contains(got, "remove ipv6") || strings.Contains(got, "flush") {
			t.Errorf("calls:\n%s\nwant both families removed and no flush", got)
		}
	})
	t.Run("lock timeout is try again later", func(t *testing.T) {
		p, h, _ := newFake()
		h.FailAll = fmt.Errorf("apply: %w", lock.ErrTimeout)
		if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); codeOf(err) != types.ErrTryAgainLater {
			t.Errorf("error %v, want code 11", err)
		}
	})
}

func TestDelWithoutPrevResultOrMappings(t *testing.T) {
	p, h, out := newFake()
	if err := p.Del(args(t, nil)); err != nil {
		t.Fatalf("Del: %v", err)
	}
	want := "lock\nledger forget net1/c1/eth0\nbackend iptables ipv4\nremove ipv4 net1/c1/eth0 - []\nbackend iptables ipv6\nremove ipv6 net1/c1/eth0 - []"
	if got := h.Calls(); got != want {
		t.Errorf("calls:\n%s\nwant:\n%s", got, want)
	}
	if out.Len() != 0 {
		t.Errorf("DEL printed %q", out)
	}
}

func TestDelFlushesKnownPorts(t *testing.T) {
	p, h, _ := newFake()
	if err := p.Del(args(t, withMappings(nil))); err != nil {
		t.Fatalf("Del: %v", err)
	}
	got := h.Calls()
	if !strings.Contains(got, "flush ipv4 udp 8053") || !strings.Contains(got, "flush ipv6 udp 8053") || strings.Contains(got, "tcp 8080") {
		t.Errorf("calls:\n%s\nwant UDP flushed in both families, TCP not", got)
	}
	// With a prevResult of one family, the other family's walk is skipped.
	p, h, _ = newFake()
	prev4 := `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c"}],"ips":[{"address":"192.0.2.2/24","interface":0}]}`
	if err := p.Del(args(t, withMappings(map[string]string{"prevResult": prev4}))); err != nil {
		t.Fatalf("Del: %v", err)
	}
	got = h.Calls()
	if !strings.Contains(got, "flush ipv4 udp 8053") || strings.Contains(got, "flush ipv6") || !strings.Contains(got, "remove ipv6") {
		t.Errorf("calls:\n%s\nwant both families removed, only IPv4 flushed", got)
	}
}

// The flush is told where each host port goes: ADD, where its rules send
// it (the flows translated there are right and stay); DEL, where they
// sent it (only those flows are wrong now: a newer attachment's stay),
// and, without prevResult, nowhere known (every flow, as upstream).
func TestFlushSaysWhereThePortGoes(t *testing.T) {
	ap := netip.MustParseAddrPort
	port := func(f plan.Family, to string, gone bool) conntrack.Port {
		p := conntrack.Port{Family: f, Protocol: plan.UDP, Port: 8053, Gone: gone}
		if to != "" {
			p.To = ap(to)
		}
		return p
	}
	prev4 := `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c"}],"ips":[{"address":"192.0.2.2/24","interface":0}]}`
	for _, tt := range []struct {
		name string
		verb func(*Plugin, *skel.CmdArgs) error
		keys map[string]string
		want []conntrack.Port
	}{
		{"ADD", (*Plugin).Add, withMappings(map[string]string{"prevResult": prevDual}),
			[]conntrack.Port{port(plan.IPv4, "192.0.2.2:53", false), port(plan.IPv6, "[2001:db8::2]:53", false)}},
		{"DEL", (*Plugin).Del, withMappings(map[string]string{"prevResult": prev4}), []conntrack.Port{port(plan.IPv4, "192.0.2.2:53", true)}},
		{"DEL without prevResult", (*Plugin).Del, withMappings(nil), []conntrack.Port{port(plan.IPv4, "", true), port(plan.IPv6, "", true)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, h, _ := newFake()
			if err := tt.verb(p, args(t, tt.keys)); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(h.Flushed, tt.want) {
				t.Errorf("flushed %+v, want %+v", h.Flushed, tt.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	p, h, _ := newFake()
	a := args(t, withMappings(map[string]string{"prevResult": prevDual}))
	err := p.Check(a)
	if err == nil || !strings.Contains(err.Error(), "net.ipv4.conf.veth-192.0.2.2.route_localnet is 0") {
		t.Fatalf("Check before ADD's sysctl: %v, want route_localnet error", err)
	}
	h.Localnet["veth-192.0.2.2"] = true
	if err := p.Check(a); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := p.Check(args(t, withMappings(nil))); codeOf(err) != 7 {
		t.Errorf("Check without prevResult: %v, want code 7", err)
	}
}

func TestGCReadsValidAttachments(t *testing.T) {
	tests := []struct{ name, key string }{
		{"valid-attachments", "cni.dev/valid-attachments"},
		{"older attachments key", "cni.dev/attachments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, h, out := newFake()
			a := args(t, map[string]string{"cniVersion": `"1.1.0"`,
				tt.key: `[{"containerID":"c1","ifname":"eth0"},{"containerID":"c2","ifname":"net1"}]`})
			if err := p.GC(a); err != nil {
				t.Fatalf("GC: %v", err)
			}
			want := "gc ipv4 net1 [net1/c1/eth0 net1/c2/net1]"
			if got := h.Calls(); !strings.Contains(got, want) || !strings.Contains(got, "gc ipv6 net1") {
				t.Errorf("calls:\n%s\nwant %q in both families", got, want)
			}
			if out.Len() != 0 {
				t.Errorf("GC printed %q", out)
			}
		})
	}
}

func TestGCJoinsErrors(t *testing.T) {
	p, h, _ := newFake()
	h.FailAll = errors.New("table busy")
	err := p.GC(args(t, map[string]string{"cniVersion": `"1.1.0"`}))
	if err == nil || strings.Count(err.Error(), "table busy") != 2 {
		t.Errorf("GC error %v, want both families' errors", err)
	}
}

func TestStatus(t *testing.T) {
	p, h, _ := newFake()
	if err := p.Status(args(t, map[string]string{"cniVersion": `"1.1.0"`})); err != nil {
		t.Fatalf("Status: %v", err)
	}
	h.FailAll = errors.New("permission denied")
	err := p.Status(args(t, map[string]string{"cniVersion": `"1.1.0"`}))
	if codeOf(err) != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), "iptables backend cannot serve ADD: permission denied") {
		t.Errorf("Status: %v, want code 50 naming the backend and reason", err)
	}
}

// TestStatusFollowsTheSpec: STATUS is nil whenever ADD can be served,
// also with the shared rules gone while attachments hold host ports (a
// firewall flush), and then reads neither the shared rules nor the cache;
// when ADD cannot be served it is code 50, or 51 when besides a family's
// shared rules are broken and the cache holds an attachment of this
// network with host ports of that family.
func TestStatusFollowsTheSpec(t *testing.T) {
	dir := t.TempDir()
	cfg := func() *skel.CmdArgs {
		return args(t, map[string]string{"cniVersion": `"1.1.0"`, "cniCacheDir": strconv.Quote(dir)})
	}
	p, h, _ := newFake()
	conflist := `{"cniVersion":"1.1.0","name":"net1","plugins":[{"type":"ptp"},{"type":"portmap","capabilities":{"portMappings":true}}]}`
	if err := cnicache.Write(dir, cnicache.Entry{Network: "net1", ContainerID: "c1", IfName: "eth0", Conflist: []byte(conflist),
		CapabilityArgs: map[string]any{"portMappings": []any{map[string]any{"hostPort": 8080, "containerPort": 80}}},
		Result:         map[string]any{"cniVersion": "1.1.0", "ips": []any{map[string]any{"address": "192.0.2.2/24"}}}}); err != nil {
		t.Fatal(err)
	}
	h.Missing["iptables ipv4"] = "rule -A PREROUTING -j CNI-HOSTPORT-DNAT missing"
	h.Traces["iptables ipv4"] = true // iptables -t nat -F: our chains are left
	if err := p.Status(cfg()); err != nil {
		t.Errorf("shared rules flushed under an attachment, ADD servable: %v, want nil", err)
	}
	if calls := h.Calls(); strings.Contains(calls, "skeleton") {
		t.Errorf("calls:\n%s\nwant the shared rules unread while ADD can be served", calls)
	}

	h.FailReady = errors.New("no cgroup v2 hierarchy")
	err := p.Status(cfg())
	if codeOf(err) != ErrLimitedConnectivity || !strings.Contains(err.Error(), "iptables backend cannot serve ADD: no cgroup v2 hierarchy") ||
		!strings.Contains(err.Error(), "ipv4: rule -A PREROUTING -j CNI-HOSTPORT-DNAT missing") {
		t.Errorf("not ready, shared rules broken under an IPv4 attachment: %v, want code 51 naming both", err)
	}
	h.Missing["iptables ipv6"] = "chain CNI-HOSTPORT-DNAT missing"
	delete(h.Traces, "iptables ipv4")
	if err := p.Status(cfg()); codeOf(err) != ErrLimitedConnectivity {
		t.Errorf("not ready, both skeletons gone (nft flush ruleset): %v, want code 51", err)
	}
	delete(h.Missing, "iptables ipv4")
	h.Traces["iptables ipv6"] = true
	if err := p.Status(cfg()); codeOf(err) != types.ErrPluginNotAvailable {
		t.Errorf("not ready, IPv6 skeleton broken, only IPv4 attachments: %v, want code 50", err)
	}
	if err := cnicache.Write(dir, cnicache.Entry{Network: "net1", ContainerID: "c6", IfName: "eth0", Conflist: []byte(conflist),
		CapabilityArgs: map[string]any{"portMappings": []any{map[string]any{"hostPort": 8086, "containerPort": 80}}},
		Result:         map[string]any{"cniVersion": "1.1.0", "ips": []any{map[string]any{"address": "2001:db8::2/64"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Status(cfg()); codeOf(err) != ErrLimitedConnectivity || !strings.Contains(err.Error(), "ipv6: chain CNI-HOSTPORT-DNAT missing") {
		t.Errorf("not ready, IPv6 skeleton broken with an IPv6 attachment: %v, want code 51 naming it", err)
	}
	// Nothing of the IPv6 skeleton while IPv4's is whole: IPv6 was never
	// set up, and the cache is not asked (it would be read whole).
	delete(h.Traces, "iptables ipv6")
	if err := p.Status(cfg()); codeOf(err) != types.ErrPluginNotAvailable {
		t.Errorf("not ready, no IPv6 skeleton at all, IPv4's whole: %v, want code 50", err)
	}
	delete(h.Missing, "iptables ipv6")
	if err := p.Status(cfg()); codeOf(err) != types.ErrPluginNotAvailable {
		t.Errorf("not ready, nothing missing: %v, want code 50", err)
	}
	h.FailReady = nil
	h.FailAll = errors.New("permission denied")
	if err := p.Status(cfg()); codeOf(err) != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("no permission (the shared rules unreadable too): %v, want code 50", err)
	}
	h.FailAll = nil
	bad := args(t, map[string]string{"cniVersion": `"1.1.0"`, "cniCacheDir": `"cache"`})
	if err := p.Status(bad); codeOf(err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), `invalid cniCacheDir "cache"`) {
		t.Errorf("relative cniCacheDir: %v, want code 7 naming the key", err)
	}
}

type fakeInventory struct {
	entries  []inventory.Entry
	listener string
}

func (f fakeInventory) Mappings(plan.Family) ([]inventory.Entry, error) { return f.entries, nil }
func (f fakeInventory) Listener(proto, hostIP string, port int) (string, error) {
	if proto == "tcp" && port == 8080 {
		return f.listener, nil
	}
	return "", nil
}

// TestConflictPolicy: a process listening on the host port is a conflict
// under "reject", not under "replace"; the conflicts between attachments
// are judged on the real backends (TestConflictsOverMemory).
func TestConflictPolicy(t *testing.T) {
	other := inventory.Entry{HostIP: "*", HostPort: 8080, Protocol: "tcp", ContainerIP: "192.0.2.9", ContainerPort: 80, Network: "net1", ContainerID: "old", Backend: "iptables"}
	tests := []struct {
		name     string
		policy   string
		inv      fakeInventory
		wantCode uint
		wantMsg  string
	}{
		{"replace ignores", `"replace"`, fakeInventory{entries: []inventory.Entry{other}, listener: "0.0.0.0:8080"}, 0, ""},
		{"host listener", `"reject"`, fakeInventory{listener: "0.0.0.0:8080"}, ErrHostPortInUse,
			`a process on the host listens on 0.0.0.0:8080`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, h, _ := newFake()
			p.Inventory = tt.inv
			m := `{"hostPort":8080,"containerPort":80}`
			a := args(t, map[string]string{"prevResult": prevDual, "hostPortConflict": tt.policy, "runtimeConfig": `{"portMappings":[` + m + `]}`})
			err := p.Add(a)
			if tt.wantCode == 0 {
				if err != nil {
					t.Fatalf("Add: %v", err)
				}
				return
			}
			if codeOf(err) != tt.wantCode || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("Add: %v, want code %d with %q", err, tt.wantCode, tt.wantMsg)
			}
			for _, c := range h.CallList() {
				if strings.HasPrefix(c, "apply") {
					t.Errorf("a rejected ADD applied: %v", h.CallList())
				}
			}
		})
	}
	p, _, _ := newFake()
	if err := p.Add(args(t, map[string]string{"prevResult": prevDual, "hostPortConflict": `"first"`})); codeOf(err) != 7 ||
		!strings.Contains(err.Error(), `invalid hostPortConflict "first": must be "replace" or "reject"`) {
		t.Errorf("hostPortConflict \"first\": %v", err)
	}
}

func TestAddOtherFamilyOnlyIsNoOp(t *testing.T) {
	p, h, out := newFake()
	prev4 := `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"192.0.2.2/24","interface":0}]}`
	err := p.Add(args(t, map[string]string{"prevResult": prev4,
		"runtimeConfig": `{"portMappings":[{"hostPort":80,"containerPort":80,"hostIP":"::1"}]}`}))
	if err != nil {
		t.Fatalf("Add: %v", err)
	}
	for _, c := range h.CallList() {
		if strings.HasPrefix(c, "apply") {
			t.Errorf("an IPv6-only mapping was applied to an IPv4-only container: %v", h.CallList())
		}
	}
	if !strings.Contains(out.String(), "192.0.2.2/24") {
		t.Errorf("prevResult not passed through: %s", out)
	}
}

func TestForwardAcceptVerbs(t *testing.T) {
	fa := func(extra map[string]string) map[string]string {
		extra["forwardAccept"] = "true"
		return extra
	}
	t.Run("add, check, del, gc", func(t *testing.T) {
		p, h, _ := newFake()
		if err := p.Add(args(t, withMappings(fa(map[string]string{"prevResult": prevDual})))); err != nil {
			t.Fatal(err)
		}
		if err := p.Check(args(t, withMappings(fa(map[string]string{"prevResult": prevDual})))); err != nil {
			t.Fatal(err)
		}
		if err := p.Del(args(t, fa(map[string]string{}))); err != nil {
			t.Fatal(err)
		}
		got := h.Calls()
		for _, want := range []string{
			"layer forwardAccept ipv4\nbackend iptables ipv6\nlayer forwardAccept ipv6\nlock\nledger add net1/c1/eth0\napply ipv4 net1/c1/eth0 192.0.2.2",
			"apply ipv4 net1/c1/eth0 192.0.2.2 [*:8080/tcp->80 *:8053/udp->53]\napply ipv6 net1/c1/eth0 2001:db8::2",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("calls lack %q:\n%s", want, got)
			}
		}
		// The host opens each once; CHECK and DEL reach the backend and
		// the layer.
		for _, verb := range []string{"check ipv4 ", "remove ipv4 ", "remove ipv6 "} {
			if n := strings.Count(got, verb); n != 2 {
				t.Errorf("%q %d times, want 2 (backend and layer):\n%s", verb, n, got)
			}
		}
		if n := strings.Count(got, "layer forwardAccept ipv4\n"); n != 1 {
			t.Errorf("the layer opened %d times, want once:\n%s", n, got)
		}
	})
	t.Run("off by default", func(t *testing.T) {
		p, h, _ := newFake()
		if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err != nil {
			t.Fatal(err)
		}
		if err := p.Del(args(t, map[string]string{})); err != nil {
			t.Fatal(err)
		}
		if got := h.Calls(); strings.Contains(got, "forwardAccept") {
			t.Errorf("forwardAccept rules touched without the key:\n%s", got)
		}
	})
	t.Run("a failing accept undoes the ADD", func(t *testing.T) {
		p, h, _ := newFake()
		h.FailApply["forwardAccept ipv6"] = errors.New("filter table is read-only")
		if err := p.Add(args(t, withMappings(fa(map[string]string{"prevResult": prevDual})))); err == nil {
			t.Fatal("ADD succeeded")
		}
		// The ipv6 stack undoes its own backend; ADD undoes ipv4's stack.
		got := h.CallList()
		want := []string{"remove ipv6 net1/c1/eth0 2001:db8::2", "remove ipv4 net1/c1/eth0 192.0.2.2", "remove ipv4 net1/c1/eth0 192.0.2.2"}
		if len(got) < 3 || !strings.HasPrefix(got[len(got)-3], want[0]) || !strings.HasPrefix(got[len(got)-2], want[1]) || !strings.HasPrefix(got[len(got)-1], want[2]) {
			t.Errorf("calls:\n%s\nwant the ipv6 mappings, then the ipv4 accept rules and mappings removed", strings.Join(got, "\n"))
		}
		if strings.Contains(h.Calls(), "flush") || strings.Contains(h.Calls(), "route_localnet") {
			t.Errorf("a failed ADD flushed or set route_localnet:\n%s", h.Calls())
		}
	})
}

// TestAddUnderStrictForwardPorts: where firewalld drops DNATed connections
// it did not configure, ADD with host ports fails with code 50 naming
// the setting, the ports and the ways out, before anything is written;
// ADD without host ports passes through; where firewalld answers with an
// error, ADD asks to be tried again (11); where the answer came from
// firewalld.conf because the bus did not answer in time, ADD follows it
// and says so in the log.
func TestAddUnderStrictForwardPorts(t *testing.T) {
	for _, tt := range []struct {
		name     string
		strict   bool
		note     string
		err      error
		mappings bool
		code     uint
	}{
		{"strict", true, "", nil, true, 50},
		{"strict, no host ports", true, "", nil, false, 0},
		{"not strict", false, "", nil, true, 0},
		{"an error of firewalld's", false, "", errors.New("org.freedesktop.DBus.Error.AccessDenied"), true, 11},
		{"no answer, the file says off", false, "read from firewalld.conf: system bus: no answer in 2s", nil, true, 0},
		{"no answer, the file says on", true, "read from firewalld.conf: system bus: no answer in 2s", nil, true, 50},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, h, _ := newFake()
			var log strings.Builder
			p.Host.Log = &log
			asked := 0
			p.Host.StrictForwardPorts = func() (bool, string, error) { asked++; return tt.strict, tt.note, tt.err }
			extra := map[string]string{"prevResult": prevDual}
			if tt.mappings {
				extra = withMappings(extra)
			}
			err := p.Add(args(t, extra))
			if codeOf(err) != tt.code || (tt.code == 0) != (err == nil) {
				t.Fatalf("error %v (code %d), want code %d", err, codeOf(err), tt.code)
			}
			if tt.mappings != (asked == 1) {
				t.Errorf("firewalld asked %d times, want it asked once exactly for ADD with host ports", asked)
			}
			if tt.note != "" && !strings.Contains(log.String(), "portmap: "+tt.note+"\n") {
				t.Errorf("log %q: want the note %q", log.String(), tt.note)
			}
			if tt.code == 0 {
				return
			}
			if h.Calls() != "" {
				t.Errorf("calls %v: want nothing", h.CallList())
			}
			if tt.code == 50 {
				for _, want := range []string{"StrictForwardPorts is on", "8080/tcp", "8053/udp", "forward them in firewalld", "StrictForwardPorts=no"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
			}
		})
	}
}
