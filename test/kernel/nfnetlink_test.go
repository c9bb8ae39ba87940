package kernel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
	"github.com/portmap-dev/portmap/test/nettest"
)

// viaNft is the kernel as the nft-based releases wrote it: every
// transaction is the nft script Text renders, fed to nft -f; reads stay
// netlink. It is the reference the netlink writer is held to.
type viaNft struct{ nftables.Kernel }

func (viaNft) Apply(tx *nft.Tx) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(tx.Text())
	if out, err := cmd.CombinedOutput(); err != nil {
		// as the backend's own nft fallback says it: refused, kind unknown
		return &nft.Error{Op: "nft -f", Err: fmt.Errorf("%w (%w)", &exec.ExitError{ProcessState: cmd.ProcessState, Stderr: out}, nft.ErrRefused)}
	}
	return nil
}

// inNS runs f with a backend of family fam whose socket lives in n.
func inNS(t *testing.T, n ns.NetNS, fam plan.Family, nft bool, f func(b *nftables.Backend) error) {
	t.Helper()
	err := n.Do(func(ns.NetNS) error {
		b, err := nftables.New(fam, io.Discard)
		if err != nil {
			return err
		}
		b.Lock = func() (func(), error) { return func() {}, nil }
		if nft {
			b.Kernel = viaNft{b.Kernel}
		}
		return f(b)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func listIn(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	var out []byte
	err := n.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("nft", args...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// equivalencePlans cover every statement the writer spells: both
// families, a host IP, UDP and SCTP, masqAll (a /0 source), another mark
// bit, SNAT off, a subnet that is not a whole number of bytes.
func equivalencePlans() map[string][]*plan.Plan {
	m := func(id, ip string, masq plan.Masquerade, maps ...plan.Mapping) *plan.Plan {
		n := cidr(ip)
		req := plan.Request{Owner: plan.Owner{Network: "net1", ContainerID: id, IfName: "eth0"}, Masquerade: masq, Mappings: plan.MappingsOf(maps...)}
		return plan.Build(req, plan.FamilyOf(n.IP), n)
	}
	on := plan.Masquerade{Enabled: true, MarkBit: 13}
	tcp := plan.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP}
	return map[string][]*plan.Plan{
		"v4": {m("c1", "192.0.2.2/24", on, tcp,
			plan.Mapping{HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP, HostIP: net.ParseIP("198.51.100.1").To4()},
			plan.Mapping{HostPort: 9000, ContainerPort: 9000, Protocol: plan.SCTP}),
			m("c2", "10.1.2.3/23", on, plan.Mapping{HostPort: 8081, ContainerPort: 81, Protocol: plan.TCP})},
		"v6": {m("c1", "2001:db8::2/64", on, tcp,
			plan.Mapping{HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP, HostIP: net.ParseIP("2001:db8:1::1")})},
		"masqall-bit5": {m("c1", "192.0.2.2/24", plan.Masquerade{Enabled: true, All: true, MarkBit: 5}, tcp)},
		// flat, a /0 hairpin source (hairpin_0), both families
		"masqall-flat": {m("c1", "192.0.2.2/24", plan.Masquerade{Enabled: true, All: true, MarkBit: 13}, tcp)},
		"masqall-flat-v6": {m("c1", "2001:db8::2/64", plan.Masquerade{Enabled: true, All: true, MarkBit: 13}, tcp,
			plan.Mapping{HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP, HostIP: net.ParseIP("2001:db8:1::1")})},
		"snat-off": {m("c1", "192.0.2.2/24", plan.Masquerade{}, tcp)},
		// Runs: an identity range (one rule, dnat to the address), an
		// offset range (a rule per port), a UDP range on a host IP.
		"ranges-v4": {m("c1", "192.0.2.2/24", on, ranges(net.ParseIP("198.51.100.1").To4())...)},
		"ranges-v6": {m("c1", "2001:db8::2/64", on, ranges(net.ParseIP("2001:db8:1::1"))...)},
		// Enough single mappings of each host IP kind for a DNAT map each
		// (TCP and UDP on the wildcard, a host IP's), beside a range.
		"maps-v4": {m("c1", "192.0.2.2/24", on, spread(net.ParseIP("198.51.100.1").To4())...)},
		"maps-v6": {m("c1", "2001:db8::2/64", on, spread(net.ParseIP("2001:db8:1::1"))...)},
		// Intervals taken over: c2 cuts c1's range in two, c3's port
		// shadows c1's interval, c4 takes c2's range whole and a piece
		// of c1's, leaving it one port.
		"ranges-takeover": {m("c1", "192.0.2.2/24", on, fixture.Span(plan.TCP, 10000, 10000, 50)...),
			m("c2", "192.0.2.3/24", on, fixture.Span(plan.TCP, 10010, 10010, 10)...),
			m("c3", "192.0.2.4/24", on, plan.Mapping{HostPort: 10030, ContainerPort: 10030, Protocol: plan.TCP}),
			m("c4", "192.0.2.5/24", on, fixture.Span(plan.TCP, 10001, 10001, 25)...)},
	}
}

// wantElements are map elements the listing of plans must show: for the
// takeover of intervals, what is left of each.
func wantElements(name string, plans []*plan.Plan) []string {
	if name != "ranges-takeover" {
		return nil
	}
	c := func(i int) string { return nftables.ChainName(plans[i].Owner) }
	return []string{
		"tcp . 10000 : goto " + c(0), // a port left of an interval
		"tcp . 10030 comment \"" + c(2) + " 192.0.2.0/24 127.0.0.1/32\" : 192.0.2.4 . 10030", // a flat attachment's
		"tcp . 10001-10025 : goto " + c(3), "tcp . 10026-10049 : goto " + c(0),
	}
}

// spread is 12 single mappings on the wildcard (TCP and UDP), 9 on
// hostIP, and a range.
func spread(hostIP net.IP) []plan.Mapping {
	var ms []plan.Mapping
	for i := range 12 {
		proto := plan.TCP
		if i%3 == 0 {
			proto = plan.UDP
		}
		ms = append(ms, plan.Mapping{HostPort: 20000 + 2*i, ContainerPort: 80 + i, Protocol: proto})
	}
	for i := range 9 {
		ms = append(ms, plan.Mapping{HostIP: hostIP, HostPort: 21000 + 2*i, ContainerPort: 80, Protocol: plan.TCP})
	}
	return append(ms, fixture.Span(plan.TCP, 10000, 10000, 50)...)
}

func ranges(hostIP net.IP) []plan.Mapping {
	ms := fixture.Span(plan.TCP, 10000, 10000, 50)
	ms = append(ms, fixture.Span(plan.TCP, 8000, 9000, 3)...)
	for _, m := range fixture.Span(plan.UDP, 5000, 5000, 3) {
		m.HostIP = hostIP
		ms = append(ms, m)
	}
	return ms
}

// TestNetlinkWritesWhatNftWrites applies the same plans through the
// netlink writer in one namespace and through nft (the script Text
// renders) in another, and compares what nft lists: the kernel objects
// must be the same, so the golden nft scripts describe what netlink
// writes.
func TestNetlinkWritesWhatNftWrites(t *testing.T) {
	for name, plans := range equivalencePlans() {
		t.Run(name, func(t *testing.T) {
			nl, ref := nettest.NewNS(t), nettest.NewNS(t)
			fam := plans[0].Family
			for _, x := range []struct {
				n   ns.NetNS
				nft bool
			}{{nl, false}, {ref, true}} {
				inNS(t, x.n, fam, x.nft, func(b *nftables.Backend) error {
					for _, p := range plans {
						if err := b.Apply(p); err != nil {
							return err
						}
					}
					return nil
				})
			}
			got, want := listIn(t, nl, "list", "ruleset"), listIn(t, ref, "list", "ruleset")
			if got != want {
				t.Errorf("netlink wrote:\n%s\nnft wrote:\n%s", got, want)
			}
			for _, el := range wantElements(name, plans) {
				if !strings.Contains(got, el) {
					t.Errorf("no element %q in:\n%s", el, got)
				}
			}
			// --debug=netlink also prints each rule's expressions: the same
			// text from other expressions would show. (Its element lines
			// come in hash order, which differs between namespaces; the
			// listing above compares the elements.)
			got, want = rules(listIn(t, nl, "--debug=netlink", "list", "ruleset")), rules(listIn(t, ref, "--debug=netlink", "list", "ruleset"))
			if got != want {
				t.Errorf("netlink wrote the expressions:\n%s\nnft wrote:\n%s", got, want)
			}
		})
	}
}

// rules drops the element lines of nft --debug=netlink output, and the
// byteorder of a concatenation of ranges' one-byte protocol that nft
// before 1.1 writes (a no-op, which the netlink writer leaves out as nft
// 1.1 does: Debian 13's kernel refuses it).
func rules(debug string) string {
	var out []string
	for _, l := range strings.Split(debug, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "element ") && !oneByteOrder.MatchString(l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

var oneByteOrder = regexp.MustCompile(`^\s*\[ byteorder reg (\d+) = hton\(reg (\d+), 2, 1\) \]$`)

// TestReadyCommitsNothing: STATUS has the kernel check a batch that adds
// the table and aborts it: it answers, and the table does not appear.
func TestReadyCommitsNothing(t *testing.T) {
	n := nettest.NewNS(t)
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		inNS(t, n, f, false, func(b *nftables.Backend) error { return b.Ready(plan.Build(plan.Request{}, f, nil)) })
	}
	if rs := listIn(t, n, "list", "ruleset"); strings.TrimSpace(rs) != "" {
		t.Errorf("Ready left:\n%s", rs)
	}
	// And reads of a table that is not there say what is missing.
	inNS(t, n, plan.IPv4, false, func(b *nftables.Backend) error {
		if err := b.Check(mkPlan("net1", "c1", "192.0.2.2/24", 80)); err == nil || !strings.Contains(err.Error(), "missing") {
			return fmt.Errorf("Check of nothing: %v", err)
		}
		return nil
	})
}

// validating counts the batches the kernel is asked to check and abort,
// and the write probes.
type validating struct {
	nftables.Kernel
	checks, probes int
}

func (v *validating) Validate(tx *nft.Tx) error { v.checks++; return v.Kernel.Validate(tx) }

func (v *validating) Writable(f plan.Family) error { v.probes++; return v.Kernel.Writable(f) }

// TestReadyReadsTheSkeleton: beside the skeleton STATUS reads the
// dispatch chain and sends no batch; after a flush it sends the write
// probe, a batch that commits nothing, and still answers ready. No batch
// is aborted (an aborted batch waits an RCU grace period holding
// nf_tables' commit lock) unless the kernel predates Linux 6.3.
func TestReadyReadsTheSkeleton(t *testing.T) {
	n := nettest.NewNS(t)
	probe := nfnl.ReleaseAtLeast(nfnl.Release(), 6, 3)
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		ip := map[plan.Family]string{plan.IPv4: "192.0.2.2/24", plan.IPv6: "2001:db8::2/64"}[f]
		inNS(t, n, f, false, func(b *nftables.Backend) error { return b.Apply(mkPlan("net1", "c1", ip, 80)) })
		for _, step := range []struct {
			name           string
			checks, probes int
		}{{"beside the skeleton", 0, 0}, {"after a flush", 1, 1}} {
			if step.probes == 1 {
				listIn(t, n, "flush", "ruleset")
				if probe {
					step.checks = 0
				}
			}
			inNS(t, n, f, false, func(b *nftables.Backend) error {
				v := &validating{Kernel: b.Kernel}
				b.Kernel = v
				if err := b.Ready(plan.Build(plan.Request{}, f, nil)); err != nil {
					return fmt.Errorf("%s %s: %w", f, step.name, err)
				}
				if v.checks != step.checks || v.probes != step.probes {
					return fmt.Errorf("%s %s: %d batches checked, %d probes; want %d, %d", f, step.name, v.checks, v.probes, step.checks, step.probes)
				}
				return nil
			})
			if out := listIn(t, n, "list", "ruleset"); step.probes == 1 && strings.TrimSpace(out) != "" {
				t.Errorf("%s %s: STATUS left %q", f, step.name, out)
			}
		}
	}
}

// TestBinaryStartsNoProcess runs the real binary with the nftables backend
// and an empty PATH: nothing it could start is there, so ADD (the first,
// which writes the skeleton, and the steady state), CHECK, DEL and STATUS
// succeeding means the binary starts no process for them — conntrack
// flush (UDP mapping) and route_localnet included.
func TestBinaryStartsNoProcess(t *testing.T) {
	nettest.ResetNAT(t)
	empty := t.TempDir()
	run := func(verb, id string, conf map[string]any) {
		t.Helper()
		stdin, _ := json.Marshal(conf)
		cmd := exec.Command(filepath.Join(nettest.BinDir(), "portmap"))
		cmd.Env = append(nettest.PluginEnv(verb, id, "/x", nettest.BinDir()), "PATH="+empty)
		cmd.Stdin = bytes.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s with an empty PATH: %v\n%s", verb, id, err, out)
		}
	}
	mappings := []nettest.Mapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 8053, ContainerPort: 53, Protocol: "udp"}}
	for _, id := range []string{"first", "second"} {
		conf := nettest.PortmapConf("net1", "nftables", mappings, "192.0.2.2/24", "2001:db8::2/64")
		if id == "second" {
			conf["runtimeConfig"] = map[string]any{"portMappings": []nettest.Mapping{{HostPort: 9090, ContainerPort: 90, Protocol: "udp"}}}
		}
		run("ADD", id, conf)
		run("CHECK", id, conf)
		run("DEL", id, conf)
	}
	status := nettest.PortmapConf("net1", "nftables", nil)
	status["cniVersion"] = "1.1.0"
	run("STATUS", "", status)
}

// TestShadowedIntervalOnTheKernel: a flat attachment's port inside an
// older interval takes the port (its DNAT map is looked up before the
// interval maps), so CHECK of the interval's attachment names it; a
// newer interval takes the port back from the flat attachment, whose
// element goes. The in-memory kernel found CHECK blind to the first.
func TestShadowedIntervalOnTheKernel(t *testing.T) {
	span := func(id, ip string) *plan.Plan {
		req := plan.Request{Owner: plan.Owner{Network: "net1", ContainerID: id, IfName: "eth0"},
			Masquerade: plan.Masquerade{Enabled: true, MarkBit: 13}}
		for _, m := range fixture.Span(plan.TCP, 20000, 20000, 100) {
			req.Mappings.Add(m)
		}
		return plan.Build(req, plan.IPv4, cidr(ip))
	}
	single := mkPlan("net1", "single", "192.0.2.4/24", 20070)
	n := nettest.NewNS(t)
	inNS(t, n, plan.IPv4, false, func(b *nftables.Backend) error {
		older := span("older", "192.0.2.2/24")
		for _, p := range []*plan.Plan{older, single} {
			if err := b.Apply(p); err != nil {
				return err
			}
		}
		if err := b.Check(older); err == nil || !strings.Contains(err.Error(), "tcp . 20070 ") {
			return fmt.Errorf("CHECK of the shadowed interval: %v, want tcp . 20070 named", err)
		}
		if err := b.Apply(span("newer", "192.0.2.5/24")); err != nil {
			return err
		}
		if err := b.Check(single); err == nil || !strings.Contains(err.Error(), "20070") {
			return fmt.Errorf("CHECK of the single port taken over: %v, want 20070 named", err)
		}
		return nil
	})
	if got := listIn(t, n, "list", "map", "ip", nftables.Table, nftables.HostDNATMap); strings.Contains(got, "20070") {
		t.Errorf("the flat element taken over stays:\n%s", got)
	}
}

// TestRangeCutBesideAFlatPortOnTheKernel: a pass repairs a range that
// cuts an older range down to a port a newer flat attachment holds; the
// older range gets nothing back over the flat element (an element of one
// port in the verdict map would shadow it), and a second pass writes
// nothing. Before, that element came back and every pass repaired it.
func TestRangeCutBesideAFlatPortOnTheKernel(t *testing.T) {
	span := func(id, ip string, first, n int) *plan.Plan {
		req := plan.Request{Owner: plan.Owner{Network: "net1", ContainerID: id, IfName: "eth0"},
			Masquerade: plan.Masquerade{Enabled: true, MarkBit: 13}}
		for _, m := range fixture.Span(plan.TCP, first, first, n) {
			req.Mappings.Add(m)
		}
		return plan.Build(req, plan.IPv4, cidr(ip))
	}
	older, newer := span("older", "192.0.2.2/24", 20000, 100), span("newer", "192.0.2.5/24", 20001, 99)
	flat := mkPlan("net1", "flat", "192.0.2.4/24", 20000)
	n := nettest.NewNS(t)
	inNS(t, n, plan.IPv4, false, func(b *nftables.Backend) error {
		for _, p := range []*plan.Plan{older, flat} {
			if err := b.Apply(p); err != nil {
				return err
			}
		}
		want := []*plan.Plan{older, flat, newer}
		rep, err := b.Sync(want, converge.Options{})
		if err != nil || rep.Results[2].State != converge.Repaired {
			return fmt.Errorf("the pass: %+v, %v; want newer repaired", rep, err)
		}
		if rep, err := b.Sync(want, converge.Options{}); err != nil || rep.Wrote {
			return fmt.Errorf("a second pass: %+v, %v; want nothing written", rep, err)
		}
		for _, p := range []*plan.Plan{flat, newer} {
			if err := b.Check(p); err != nil {
				return fmt.Errorf("CHECK %s: %w", p.Owner.ContainerID, err)
			}
		}
		return nil
	})
	if got := listIn(t, n, "list", "map", "ip", nftables.Table, "hostports"); strings.Contains(got, "20000") {
		t.Errorf("the older range's port came back over the flat element:\n%s", got)
	}
	// ADD of a short range, whose read asks for the ports beside it one
	// by one: the port it leaves of the older range is the flat one's
	shortOlder, shortNewer := span("short-older", "192.0.2.2/24", 21000, 10), span("short-newer", "192.0.2.5/24", 21000, 9)
	shortFlat := mkPlan("net1", "short-flat", "192.0.2.4/24", 21009)
	inNS(t, n, plan.IPv4, false, func(b *nftables.Backend) error {
		for _, p := range []*plan.Plan{shortOlder, shortFlat, shortNewer} {
			if err := b.Apply(p); err != nil {
				return err
			}
		}
		for _, p := range []*plan.Plan{shortFlat, shortNewer} {
			if err := b.Check(p); err != nil {
				return fmt.Errorf("CHECK %s: %w", p.Owner.ContainerID, err)
			}
		}
		return nil
	})
	if got := listIn(t, n, "list", "map", "ip", nftables.Table, "hostports"); strings.Contains(got, "21009") {
		t.Errorf("the short older range's last port came back over the flat element:\n%s", got)
	}
}
