package iptables

import (
	"errors"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/test/fixture"
	"github.com/portmap-dev/portmap/test/userns"
)

// The package's tests run in a user and network namespace of their own
// (no root needed): the kernel test below drives the real tools there.
func TestMain(m *testing.M) { userns.Main(m) }

// The real kernel behind the backend — iptables-restore, the nat table
// read over nf_tables netlink, DEL by handles — in a namespace of the
// test's own: ADD, CHECK, a sync that finds nothing to do, a flush that
// CHECK and STATUS see, DEL that leaves only the shared chains.
func TestRealKernel(t *testing.T) {
	userns.Require(t)
	noLock := func() (func(), error) { return func() {}, nil }
	b, err := New(plan.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	b.Lock = noLock
	p := fixture.TestPlan(plan.IPv4, nil)
	if err := b.Ready(p); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	// On a fresh node, with iptables-nft on Linux 6.3 or later, the
	// write probe answers and no restore --test runs (here one would
	// fail); elsewhere the test is run.
	real := b.Kernel
	if nftTool(real.(*execKernel).restore) && nfnl.ReleaseAtLeast(nfnl.Release(), 6, 3) {
		b.Kernel = testFails{real, errors.New("restore --test run")}
		if err := b.Ready(p); err != nil {
			t.Fatalf("Ready on a fresh node: %v", err)
		}
		b.Kernel = real
	} else {
		t.Logf("no write probe here (%s, Linux %s): restore --test answers", real.(*execKernel).restore, nfnl.Release())
	}
	if err := b.Apply(p); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if err := b.Check(p); err != nil {
		t.Fatalf("Check after Apply: %v", err)
	}
	// Beside the chain the ADD wrote, STATUS reads it over nf_tables
	// netlink and runs no restore --test (here one would fail).
	b.Kernel = testFails{real, errors.New("restore --test run")}
	if err := b.Ready(p); err != nil {
		t.Fatalf("Ready after Apply: %v", err)
	}
	b.Kernel = real
	if missing, some, err := b.Skeleton(p); missing != "" || !some || err != nil {
		t.Fatalf("Skeleton after Apply = %q, %v, %v", missing, some, err)
	}
	rep, err := b.Sync([]*plan.Plan{p}, converge.Options{})
	if err != nil || rep.Wrote || rep.Results[0].State != converge.OK {
		t.Fatalf("Sync after Apply: %+v, %v; want nothing to do", rep, err)
	}
	ms, err := b.Mappings()
	if err != nil || len(ms) != p.Mappings.Len() {
		t.Fatalf("Mappings = %d, %v; want %d", len(ms), err, p.Mappings.Len())
	}
	k := b.Kernel.(*execKernel)
	if err := k.Restore([]byte("*nat\n-F " + ChainName(p.Owner) + "\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(p); err == nil {
		t.Fatal("Check after the attachment's chain was flushed: nil")
	}
	if err := b.Remove(p); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	lines, err := k.ListTable()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(lines, "\n"); strings.Contains(got, "CNI-DN-") {
		t.Errorf("after Remove the table still holds the attachment:\n%s", got)
	}
	fw, err := NewAccept(plan.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	fw.Lock = noLock
	if err := fw.Ready(p); err != nil {
		t.Errorf("forwardAccept Ready: %v", err)
	}
}

// noTools is a kernel whose tools may not run: a listing or a restore
// fails.
type noTools struct{ xt.Kernel }

var errTool = errors.New("a tool ran")

func (noTools) Restore([]byte) error               { return errTool }
func (noTools) Test([]byte) error                  { return errTool }
func (noTools) ListTable() ([]string, error)       { return nil, errTool }
func (noTools) ListChain(string) ([]string, error) { return nil, errTool }

// A pass beside kube-proxy's chains, on the real kernel: steady, it runs
// no tool (it reads our chains over netlink); after the attachment's
// chain and the mark chain were flushed, it repairs with the tools, and
// the pass after that is steady again — the repair's rules, written by
// this machine's iptables-restore, read as the native writer's.
func TestRealKernelSteadyPass(t *testing.T) {
	userns.Require(t)
	b, err := New(plan.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	b.Lock = func() (func(), error) { return func() {}, nil }
	real := b.Kernel.(*execKernel)
	if xt.LegacyTable(plan.IPv4, Table) || !nftTool(real.restore) {
		t.Skipf("%s writes no nf_tables table here", real.restore)
	}
	p := fixture.TestPlan(plan.IPv4, func(r *plan.Request) {
		r.Mappings = plan.Mappings{}
		r.Mappings.Add(plan.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP})
		r.Mappings.Add(plan.Mapping{HostPort: 8053, ContainerPort: 53, Protocol: plan.UDP, HostIP: fixture.HostIP})
	})
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	kube := "*nat\n-N KUBE-SERVICES\n-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp --dport 443 -j ACCEPT\n-I PREROUTING -j KUBE-SERVICES\nCOMMIT\n"
	if err := real.Restore([]byte(kube)); err != nil {
		t.Fatal(err)
	}
	// the package's tests share one namespace: leave it as found
	t.Cleanup(func() {
		if err := b.Remove(p); err != nil {
			t.Errorf("DEL: %v", err)
		}
		if err := real.Restore([]byte("*nat\n-D PREROUTING -j KUBE-SERVICES\n-F KUBE-SERVICES\n-X KUBE-SERVICES\nCOMMIT\n")); err != nil {
			t.Errorf("remove kube-proxy's chain: %v", err)
		}
	})
	steady := func(when string) {
		t.Helper()
		b.Kernel = noTools{real}
		defer func() { b.Kernel = real }()
		rep, err := b.Sync([]*plan.Plan{p}, converge.Options{})
		if err != nil || rep.Wrote || rep.Results[0].State != converge.OK {
			t.Fatalf("%s: %+v, %v; want steady without a tool", when, rep, err)
		}
	}
	steady("after ADD")
	flush := "*nat\n-F " + ChainName(p.Owner) + "\n-F " + SetMarkChain + "\nCOMMIT\n"
	if err := real.Restore([]byte(flush)); err != nil {
		t.Fatal(err)
	}
	b.Kernel = noTools{real}
	if _, err := b.Sync([]*plan.Plan{p}, converge.Options{}); !errors.Is(err, errTool) {
		t.Fatalf("after the flush, a pass without the tools: %v; want it to need them", err)
	}
	b.Kernel = real
	rep, err := b.Sync([]*plan.Plan{p}, converge.Options{})
	if err != nil || rep.Results[0].State != converge.Repaired {
		t.Fatalf("after the flush: %+v, %v; want repaired", rep, err)
	}
	steady("after the repair")
}
