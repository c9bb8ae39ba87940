package portmap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
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

// onMemory is the plugin over a host whose backends and forwardAccept
// layer are the real ones over kernels in memory, behind the recorder's
// knobs (fakehost.NewInMemory): a test judges a verb by what the
// kernels, the ledger, route_localnet and the conntrack flushes hold
// afterwards.
func onMemory() (*Plugin, *fakehost.Host, *bytes.Buffer, map[backend.Name]fakehost.InMemory) {
	h, fh, mem := fakehost.NewInMemory()
	out := &bytes.Buffer{}
	return &Plugin{Stdout: out, Host: h}, fh, out, mem
}

// held is what the kernels hold forwarded, both backends and families,
// sorted: "iptables tcp 8080 -> 192.0.2.2:80 c=c1".
func held(t *testing.T, mem map[backend.Name]fakehost.InMemory) []string {
	t.Helper()
	var out []string
	for _, b := range []backend.Name{backend.IPTables, backend.NFTables} {
		for _, l := range mapped(t, mem[b]) {
			out = append(out, string(b)+" "+l)
		}
	}
	return out
}

// heldBoth is what ADD of withMappings for c1 at prevDual forwards on
// backend b.
func heldBoth(b backend.Name) []string {
	var out []string
	for _, l := range []string{"tcp 8080 -> 192.0.2.2:80", "tcp 8080 -> [2001:db8::2]:80", "udp 8053 -> 192.0.2.2:53", "udp 8053 -> [2001:db8::2]:53"} {
		out = append(out, string(b)+" "+l+" c=c1")
	}
	return out
}

// untouched checks that nothing was done to the host: no rule, chain or
// table in either kernel, no ledger record, no lock taken, no conntrack
// walk, no route_localnet, nothing printed.
func untouched(t *testing.T, h *fakehost.Host, mem map[backend.Name]fakehost.InMemory, out *bytes.Buffer) {
	t.Helper()
	_, _, fresh := fakehost.NewInMemory()
	for name, k := range mem {
		if got, want := k.Ruleset(), fresh[name].Ruleset(); got != want {
			t.Errorf("%s holds:\n%s\nwant what a fresh kernel holds:\n%s", name, got, want)
		}
	}
	if s := h.Ledger.String(); s != "" || h.Locks != 0 || h.Walks != 0 || len(h.Localnet) != 0 || out.Len() != 0 {
		t.Errorf("ledger %q, %d locks, %d conntrack walks, route_localnet %v, stdout %q: want nothing", s, h.Locks, h.Walks, h.Localnet, out)
	}
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

// ADD maps both families on the default backend, records the attachment
// (under the host lock, once), turns route_localnet on at the
// container's host interface, and flushes the UDP port's flows of both
// families in one walk of the conntrack table.
func TestAddAppliesBothFamiliesAndPrintsPrevResult(t *testing.T) {
	p, h, out, mem := onMemory()
	if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if got, want := held(t, mem), heldBoth(backend.IPTables); !slices.Equal(got, want) {
		t.Errorf("the kernels hold %q, want %q", got, want)
	}
	if s := h.Ledger.String(); s != "add net1/c1/eth0" || h.Locks != 1 {
		t.Errorf("ledger %q after %d locks, want the ADD's record under one", s, h.Locks)
	}
	if !maps.Equal(h.Localnet, map[string]bool{"veth-192.0.2.2": true}) {
		t.Errorf("route_localnet %v, want on at the container's host interface only", h.Localnet)
	}
	var flushed []string
	for _, f := range h.Flushed {
		flushed = append(flushed, fmt.Sprintf("%s %s %d", f.Family, f.Protocol, f.Port))
	}
	if want := []string{"ipv4 udp 8053", "ipv6 udp 8053"}; !slices.Equal(flushed, want) || h.Walks != 1 {
		t.Errorf("flushed %q in %d walks, want %q in one", flushed, h.Walks, want)
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
	p, _, _, mem := onMemory()
	p.Host.DefaultBackend = func() backend.Name { return backend.NFTables }
	if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err != nil {
		t.Fatal(err)
	}
	if got, want := held(t, mem), heldBoth(backend.NFTables); !slices.Equal(got, want) {
		t.Errorf("without the key the kernels hold %q, want the default's (nftables) %q", got, want)
	}
	if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual, "backend": `"iptables"`}))); err != nil {
		t.Fatal(err)
	}
	if got, want := held(t, mem), append(heldBoth(backend.IPTables), heldBoth(backend.NFTables)...); !slices.Equal(got, want) {
		t.Errorf("with backend iptables the kernels hold %q, want %q", got, want)
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
	p, h, out, mem := onMemory()
	if err := p.Add(args(t, map[string]string{"prevResult": prevDual})); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if !strings.Contains(out.String(), "192.0.2.2/24") {
		t.Errorf("stdout %q: want the prevResult", out)
	}
	// Only the ledger's record, which DEL forgets.
	if s := h.Ledger.String(); s != "add net1/c1/eth0" {
		t.Errorf("ledger %q, want the ADD's record", s)
	}
	h.Ledger = fakehost.Ledger{}
	h.Locks = 0
	out.Reset()
	untouched(t, h, mem, out)
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
			p, h, out, mem := onMemory()
			err := p.Add(args(t, tt.extra))
			if codeOf(err) != tt.code {
				t.Fatalf("error %v (code %d), want code %d", err, codeOf(err), tt.code)
			}
			untouched(t, h, mem, out)
		})
	}
}

func TestAddUndoesOnFailure(t *testing.T) {
	t.Run("second family fails", func(t *testing.T) {
		p, h, _, mem := onMemory()
		h.FailApply["iptables ipv6"] = errors.New("kernel says no")
		err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual})))
		if err == nil || !strings.Contains(err.Error(), "iptables backend: kernel says no") {
			t.Fatalf("error %v, want the ipv6 failure", err)
		}
		if got := held(t, mem); len(got) != 0 || h.Walks != 0 {
			t.Errorf("the kernels hold %q after %d conntrack walks, want IPv4's mappings removed and nothing flushed", got, h.Walks)
		}
	})
	t.Run("route_localnet fails", func(t *testing.T) {
		p, h, _, mem := onMemory()
		h.FailSysctl = errors.New("read-only /proc")
		if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err == nil {
			t.Fatal("Add succeeded, want the sysctl error")
		}
		if got := held(t, mem); len(got) != 0 || h.Walks != 0 {
			t.Errorf("the kernels hold %q after %d conntrack walks, want both families removed and nothing flushed", got, h.Walks)
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

// DEL without a prevResult or mappings (a runtime's DEL after the
// container's end) removes what ADD wrote in both families, forgets the
// record and prints nothing.
func TestDelWithoutPrevResultOrMappings(t *testing.T) {
	for _, b := range []backend.Name{backend.IPTables, backend.NFTables} {
		t.Run(string(b), func(t *testing.T) {
			p, h, out, mem := onMemory()
			be := map[string]string{"backend": strconv.Quote(string(b))}
			if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual, "backend": be["backend"]}))); err != nil {
				t.Fatal(err)
			}
			out.Reset()
			if err := p.Del(args(t, be)); err != nil {
				t.Fatalf("Del: %v", err)
			}
			if got := held(t, mem); len(got) != 0 || h.Ledger.String() != "" || out.Len() != 0 {
				t.Errorf("after DEL the kernels hold %q, the ledger %q, stdout %q: want nothing", got, h.Ledger.String(), out)
			}
		})
	}
}

// DEL flushes the UDP ports it knows, not TCP's; with a prevResult of one
// family it removes both families' rules (the other family's are not
// known absent) and walks the conntrack table for that family only.
func TestDelFlushesKnownPorts(t *testing.T) {
	p, h, _, _ := onMemory()
	if err := p.Del(args(t, withMappings(nil))); err != nil {
		t.Fatalf("Del: %v", err)
	}
	flushed := func() (out []string) {
		for _, f := range h.Flushed {
			out = append(out, fmt.Sprintf("%s %s %d", f.Family, f.Protocol, f.Port))
		}
		return out
	}
	if got, want := flushed(), []string{"ipv4 udp 8053", "ipv6 udp 8053"}; !slices.Equal(got, want) {
		t.Errorf("flushed %q, want UDP in both families, TCP not: %q", got, want)
	}
	p, h, _, mem := onMemory()
	if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err != nil {
		t.Fatal(err)
	}
	h.Flushed = nil
	prev4 := `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c"}],"ips":[{"address":"192.0.2.2/24","interface":0}]}`
	if err := p.Del(args(t, withMappings(map[string]string{"prevResult": prev4}))); err != nil {
		t.Fatalf("Del: %v", err)
	}
	if got, want := flushed(), []string{"ipv4 udp 8053"}; !slices.Equal(got, want) {
		t.Errorf("flushed %q, want only IPv4's %q", got, want)
	}
	if got := held(t, mem); len(got) != 0 {
		t.Errorf("after DEL with an IPv4 prevResult the kernels hold %q, want both families removed", got)
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
			p, _, out, mem := onMemory()
			for i, o := range []struct{ id, ifName string }{{"c1", "eth0"}, {"c2", "net1"}, {"c3", "eth0"}} {
				prev := fmt.Sprintf(`{"cniVersion":"1.0.0","interfaces":[{"name":%q,"sandbox":"/run/netns/c"}],"ips":[{"address":"192.0.2.%d/24","interface":0},{"address":"2001:db8::%d/64","interface":0}]}`, o.ifName, 2+i, 2+i)
				a := args(t, map[string]string{"prevResult": prev, "runtimeConfig": fmt.Sprintf(`{"portMappings":[{"hostPort":%d,"containerPort":80}]}`, 8080+i)})
				a.ContainerID, a.IfName = o.id, o.ifName
				if err := p.Add(a); err != nil {
					t.Fatal(err)
				}
			}
			out.Reset()
			a := args(t, map[string]string{"cniVersion": `"1.1.0"`,
				tt.key: `[{"containerID":"c1","ifname":"eth0"},{"containerID":"c2","ifname":"net1"}]`})
			if err := p.GC(a); err != nil {
				t.Fatalf("GC: %v", err)
			}
			want := []string{
				"iptables tcp 8080 -> 192.0.2.2:80 c=c1", "iptables tcp 8080 -> [2001:db8::2]:80 c=c1",
				"iptables tcp 8081 -> 192.0.2.3:80 c=c2", "iptables tcp 8081 -> [2001:db8::3]:80 c=c2",
			}
			if got := held(t, mem); !slices.Equal(got, want) {
				t.Errorf("after GC the kernels hold %q, want the valid attachments' %q", got, want)
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
	if h.SkeletonReads != 0 {
		t.Errorf("the shared rules read %d times, want unread while ADD can be served", h.SkeletonReads)
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
			p, h, out, mem := onMemory()
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
			untouched(t, h, mem, out)
		})
	}
	p, _, _ := newFake()
	if err := p.Add(args(t, map[string]string{"prevResult": prevDual, "hostPortConflict": `"first"`})); codeOf(err) != 7 ||
		!strings.Contains(err.Error(), `invalid hostPortConflict "first": must be "replace" or "reject"`) {
		t.Errorf("hostPortConflict \"first\": %v", err)
	}
}

func TestAddOtherFamilyOnlyIsNoOp(t *testing.T) {
	p, _, out, mem := onMemory()
	prev4 := `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"192.0.2.2/24","interface":0}]}`
	err := p.Add(args(t, map[string]string{"prevResult": prev4,
		"runtimeConfig": `{"portMappings":[{"hostPort":80,"containerPort":80,"hostIP":"::1"}]}`}))
	if err != nil {
		t.Fatalf("Add: %v", err)
	}
	if got := held(t, mem); len(got) != 0 {
		t.Errorf("an IPv6-only mapping for an IPv4-only container: the kernels hold %q, want nothing", got)
	}
	if !strings.Contains(out.String(), "192.0.2.2/24") {
		t.Errorf("prevResult not passed through: %s", out)
	}
}

// acceptRules are the forwardAccept layer's rules the x_tables filter
// tables hold, both families.
func acceptRules(mem map[backend.Name]fakehost.InMemory) []string {
	var out []string
	for _, l := range strings.Split(mem[backend.IPTables].Ruleset(), "\n") {
		if strings.HasPrefix(l, "-A CNI-FW-") {
			out = append(out, l)
		}
	}
	return out
}

// forwardAccept writes an accept rule per mapping and family beside the
// backend's mappings; CHECK passes over both, DEL removes both; without
// the key nothing of it is written; a family whose accept rules fail
// leaves neither family's rules nor mappings, no flush, no
// route_localnet.
func TestForwardAcceptVerbs(t *testing.T) {
	fa := func(extra map[string]string) map[string]string {
		extra["forwardAccept"] = "true"
		return extra
	}
	t.Run("add, check, del", func(t *testing.T) {
		p, _, _, mem := onMemory()
		if err := p.Add(args(t, withMappings(fa(map[string]string{"prevResult": prevDual})))); err != nil {
			t.Fatal(err)
		}
		got := acceptRules(mem)
		for _, want := range []string{"--ctorigdstport 8080 --ctreplsrc 192.0.2.2 --ctreplsrcport 80 -j ACCEPT", "--ctorigdstport 8053 --ctreplsrc 192.0.2.2 --ctreplsrcport 53 -j ACCEPT",
			"--ctorigdstport 8080 --ctreplsrc 2001:db8::2 --ctreplsrcport 80 -j ACCEPT", "--ctorigdstport 8053 --ctreplsrc 2001:db8::2 --ctreplsrcport 53 -j ACCEPT"} {
			if !slices.ContainsFunc(got, func(l string) bool { return strings.HasSuffix(l, want) }) {
				t.Errorf("accept rules %q lack one ending %q", got, want)
			}
		}
		if len(got) != 4 || len(held(t, mem)) != 4 {
			t.Errorf("accept rules %q and mappings %q, want four of each", got, held(t, mem))
		}
		if err := p.Check(args(t, withMappings(fa(map[string]string{"prevResult": prevDual})))); err != nil {
			t.Fatal(err)
		}
		if err := p.Del(args(t, fa(map[string]string{}))); err != nil {
			t.Fatal(err)
		}
		if got := acceptRules(mem); len(got) != 0 || len(held(t, mem)) != 0 {
			t.Errorf("after DEL: accept rules %q, mappings %q, want none", got, held(t, mem))
		}
	})
	t.Run("off by default", func(t *testing.T) {
		p, _, _, mem := onMemory()
		if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err != nil {
			t.Fatal(err)
		}
		if rs := mem[backend.IPTables].Ruleset(); strings.Contains(rs, "CNI-HOSTPORT-FWD") || strings.Contains(rs, "CNI-FW-") {
			t.Errorf("forwardAccept's chains written without the key:\n%s", rs)
		}
	})
	t.Run("a failing accept undoes the ADD", func(t *testing.T) {
		p, h, _, mem := onMemory()
		h.FailApply["forwardAccept ipv6"] = errors.New("filter table is read-only")
		if err := p.Add(args(t, withMappings(fa(map[string]string{"prevResult": prevDual})))); err == nil {
			t.Fatal("ADD succeeded")
		}
		if rules, ms := acceptRules(mem), held(t, mem); len(rules)+len(ms) != 0 || h.Walks != 0 || len(h.Localnet) != 0 {
			t.Errorf("after the failed ADD: accept rules %q, mappings %q, %d conntrack walks, route_localnet %v: want nothing", rules, ms, h.Walks, h.Localnet)
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
			p, h, out, mem := onMemory()
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
			untouched(t, h, mem, out)
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

// TestTwoInterfacesOnOneNetwork: a container attached twice to one
// network (eth0 and net1, a host port each). nftables keeps both; the
// iptables layout names an attachment's chain after its network and
// container ID only, as upstream does, so there the second ADD's
// mappings replace the first's and DEL of either removes them
// (docs/backends.md). DEL of one leaves the other's on nftables.
func TestTwoInterfacesOnOneNetwork(t *testing.T) {
	for _, tt := range []struct {
		backend        backend.Name
		added, deleted []string
	}{
		{backend.NFTables, []string{"nftables tcp 8080 -> 192.0.2.2:80 c=c1", "nftables tcp 8081 -> 192.0.2.3:80 c=c1"}, []string{"nftables tcp 8081 -> 192.0.2.3:80 c=c1"}},
		{backend.IPTables, []string{"iptables tcp 8081 -> 192.0.2.3:80 c=c1"}, nil},
	} {
		t.Run(string(tt.backend), func(t *testing.T) {
			p, _, _, mem := onMemory()
			cmd := func(i int, ifName string) *skel.CmdArgs {
				prev := fmt.Sprintf(`{"cniVersion":"1.0.0","interfaces":[{"name":%q,"sandbox":"/run/netns/c"}],"ips":[{"address":"192.0.2.%d/24","interface":0}]}`, ifName, 2+i)
				a := args(t, map[string]string{"backend": strconv.Quote(string(tt.backend)), "prevResult": prev,
					"runtimeConfig": fmt.Sprintf(`{"portMappings":[{"hostPort":%d,"containerPort":80}]}`, 8080+i)})
				a.IfName = ifName
				return a
			}
			for i, ifName := range []string{"eth0", "net1"} {
				if err := p.Add(cmd(i, ifName)); err != nil {
					t.Fatal(err)
				}
			}
			if got := held(t, mem); !slices.Equal(got, tt.added) {
				t.Errorf("after both ADDs the kernel holds %q, want %q", got, tt.added)
			}
			if err := p.Del(cmd(0, "eth0")); err != nil {
				t.Fatal(err)
			}
			if got := held(t, mem); !slices.Equal(got, tt.deleted) {
				t.Errorf("after eth0's DEL the kernel holds %q, want %q", got, tt.deleted)
			}
		})
	}
}
