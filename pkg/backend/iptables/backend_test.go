package iptables

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/test/fixture"
)

// The fake kernel of sync_test.go (a canned listing of net1/a, net1/b and
// old/o, restores recorded, one failing on a given substring) drives the
// verbs' branches without root.

func lockedBackend(t *testing.T, failOn string) (*Backend, *fakeKernel, *int) {
	t.Helper()
	b, k := syncBackend(t, failOn)
	locks := 0
	b.Lock = func() (func(), error) { locks++; return func() {}, nil }
	return b, k, &locks
}

func TestApplyFastPath(t *testing.T) {
	b, k, locks := lockedBackend(t, "")
	c, _, _ := syncPlans("192.0.2.7")
	c.Owner.ContainerID = "new"
	if err := b.Apply(c); err != nil {
		t.Fatal(err)
	}
	if len(k.restores) != 1 || *locks != 0 || len(k.ensures) != 0 || !strings.Contains(k.restores[0], "-N "+ChainName(c.Owner)) {
		t.Errorf("fast path: restores %q, locks %d, ensures %v; want one restore, no lock", k.restores, *locks, k.ensures)
	}
}

func TestApplySlowPathReplaces(t *testing.T) {
	// Re-ADD of a with a new address: -N fails (the chain exists), so the
	// slow path ensures the shared objects, finds a's entry rules in the
	// listing and replaces them, never duplicating.
	a, _, _ := syncPlans("192.0.2.9")
	b, k, locks := lockedBackend(t, "-N "+ChainName(a.Owner))
	if err := b.Apply(a); err != nil {
		t.Fatal(err)
	}
	if *locks != 1 || len(k.ensures) == 0 || len(k.restores) != 2 {
		t.Fatalf("slow path: locks %d, ensures %v, restores %q", *locks, k.ensures, k.restores)
	}
	p := k.restores[1]
	chain := ChainName(a.Owner)
	for _, w := range []string{
		`-D CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net1\" id: \"a\"" -m multiport --dports 8080 -j ` + chain,
		`-D CNI-HOSTPORT-DNAT -p udp -m comment --comment "dnat name: \"net1\" id: \"a\"" -m multiport --dports 8053 -j ` + chain,
		":" + chain + " - [0:0]",
		"--to-destination 192.0.2.9:80",
	} {
		if !strings.Contains(p, w) {
			t.Errorf("replace payload lacks %q:\n%s", w, p)
		}
	}
	if strings.Contains(p, "-N ") {
		t.Errorf("replace payload creates with -N:\n%s", p)
	}
	// The shared rules, their chains listed, are each checked and
	// inserted; the marker of bit 13, listed, is not made again.
	if e := strings.Join(k.ensures, "\n"); !strings.Contains(e, "-j CNI-HOSTPORT-MASQ") || strings.Contains(e, MarkerChain(13)) {
		t.Errorf("ensured %q; want the shared rules and not the listed marker", k.ensures)
	}

	if err := b.Apply(plan.Build(plan.Request{Owner: a.Owner}, plan.IPv4, nil)); err == nil {
		t.Error("Apply without a container address succeeded")
	}
}

// TestMarkerPerBit: the fast path of a plan stands on its own mark bit's
// marker chain, so a node whose skeleton was made for another bit sends
// it to the slow path, which ensures that bit's rules.
func TestMarkerPerBit(t *testing.T) {
	c, _, _ := syncPlans("192.0.2.7")
	c.Owner.ContainerID = "new"
	c.Masquerade.MarkBit = 5
	b, k, locks := lockedBackend(t, "-F "+MarkerChain(5))
	if err := b.Apply(c); err != nil {
		t.Fatal(err)
	}
	if *locks != 1 || len(k.restores) != 2 || !strings.Contains(strings.Join(k.ensures, "\n"), "--set-xmark 0x20/0x20") ||
		!strings.HasSuffix(k.restores[1], "-N "+MarkerChain(5)+"\nCOMMIT\n") {
		t.Errorf("bit 5 on a bit-13 node: locks %d, ensures %q, restores %q; want its rules ensured, then its chain and marker in one restore, the marker last",
			*locks, k.ensures, k.restores)
	}
	if _, nat, _ := strings.Cut(AddScript(c), "*nat\n"); strings.Contains(nat, "-C ") || !strings.Contains(nat, "-F "+MarkerChain(5)+"\n") {
		t.Errorf("fast path's nat section checks rules, or not the marker:\n%s", nat)
	}
}

func TestApplySlowPathNamesTheFailingLine(t *testing.T) {
	a, _, _ := syncPlans("192.0.2.9")
	b, _, _ := lockedBackend(t, "--to-destination 192.0.2.9:53")
	err := b.Apply(a)
	var re *xt.RestoreError
	if err == nil || !errors.As(err, &re) || !strings.Contains(err.Error(), "apply: rule") || !strings.Contains(err.Error(), "192.0.2.9:53") {
		t.Errorf("error %v, want the failing rule named", err)
	}
}

func TestRemove(t *testing.T) {
	a, _, _ := syncPlans("192.0.2.2")
	t.Run("iptables-nft: over netlink, no process", func(t *testing.T) {
		for _, found := range []bool{true, false} {
			b, k, locks := lockedBackend(t, "")
			k.unlink = func(string) (bool, error) { return found, nil }
			bare := plan.Build(plan.Request{Owner: a.Owner}, plan.IPv4, nil)
			if err := b.Remove(bare); err != nil {
				t.Fatal(err)
			}
			if len(k.restores) != 0 || *locks != 0 || len(k.unlinked) != 1 || k.unlinked[0] != TopLevelDNATChain+" -> "+ChainName(a.Owner) {
				t.Errorf("found %v: restores %q, locks %d, unlinked %q; want one unlink, nothing else", found, k.restores, *locks, k.unlinked)
			}
		}
	})
	t.Run("iptables-nft: a failed transaction goes to the slow path", func(t *testing.T) {
		b, k, locks := lockedBackend(t, "")
		k.unlink = func(string) (bool, error) { return true, unix.EBUSY }
		if err := b.Remove(a); err != nil {
			t.Fatal(err)
		}
		if *locks != 1 || len(k.restores) != 1 || !strings.Contains(k.restores[0], "-X "+ChainName(a.Owner)) {
			t.Errorf("restores %q, locks %d; want the slow path's one restore", k.restores, *locks)
		}
	})
	t.Run("fast path", func(t *testing.T) {
		b, k, locks := lockedBackend(t, "")
		if err := b.Remove(a); err != nil {
			t.Fatal(err)
		}
		if len(k.restores) != 1 || *locks != 0 || !strings.Contains(k.restores[0], "-X "+ChainName(a.Owner)) {
			t.Errorf("restores %q locks %d", k.restores, *locks)
		}
	})
	t.Run("without mappings: found by chain name", func(t *testing.T) {
		b, k, locks := lockedBackend(t, "")
		bare := plan.Build(plan.Request{Owner: a.Owner}, plan.IPv4, nil)
		if err := b.Remove(bare); err != nil {
			t.Fatal(err)
		}
		if *locks != 1 || len(k.restores) != 1 || strings.Count(k.restores[0], "-D CNI-HOSTPORT-DNAT") != 2 {
			t.Errorf("restores %q locks %d: want the two entry rules deleted from the listing", k.restores, *locks)
		}
	})
	t.Run("an attachment the kernel does not know: nothing written", func(t *testing.T) {
		b, k, _ := lockedBackend(t, "")
		gone := plan.Build(plan.Request{Owner: plan.Owner{Network: "net1", ContainerID: "gone"}}, plan.IPv4, nil)
		if err := b.Remove(gone); err != nil || len(k.restores) != 0 {
			t.Errorf("%v, restores %q", err, k.restores)
		}
	})
}

func TestCheckNamesWhatIsMissing(t *testing.T) {
	a, _, _ := syncPlans("192.0.2.2")
	b, _, _ := lockedBackend(t, "")
	if err := b.Check(a); err != nil {
		t.Errorf("Check: %v", err)
	}
	b, _, _ = lockedBackend(t, "-C OUTPUT")
	if err := b.Check(a); err == nil || !strings.Contains(err.Error(), `missing rule "-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT" in table nat`) {
		t.Errorf("Check: %v", err)
	}
}

func TestGCSelectsByNetworkAndValidity(t *testing.T) {
	b, k, locks := lockedBackend(t, "")
	a, bb, o := syncPlans("192.0.2.2")
	if err := b.GC("net1", []plan.Owner{a.Owner}); err != nil {
		t.Fatal(err)
	}
	if *locks != 1 || len(k.restores) != 1 {
		t.Fatalf("restores %q", k.restores)
	}
	p := k.restores[0]
	if !strings.Contains(p, "-X "+ChainName(bb.Owner)) || strings.Contains(p, ChainName(a.Owner)) || strings.Contains(p, ChainName(o.Owner)) {
		t.Errorf("GC of net1 keeping a:\n%s\nwant b's chain gone, a's and the other network's kept", p)
	}
	// Nothing stale: nothing written.
	b, k, _ = lockedBackend(t, "")
	if err := b.GC("net1", []plan.Owner{a.Owner, bb.Owner}); err != nil || len(k.restores) != 0 {
		t.Errorf("%v, restores %q", err, k.restores)
	}
	// An entry rule whose comment names an owner the chain it jumps to
	// is not the hash of (a comment cut short, another's rule) proves
	// nothing: GC keeps it.
	b, k, _ = lockedBackend(t, "")
	k.lines = append(k.lines, "-N CNI-DN-0123456789abcdef01234",
		`-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net1\" id: \"cut\"" -m multiport --dports 9090 -j CNI-DN-0123456789abcdef01234`)
	if err := b.GC("net1", []plan.Owner{a.Owner, bb.Owner}); err != nil || len(k.restores) != 0 {
		t.Errorf("GC beside a chain its comment does not hash to: %v, restores %q", err, k.restores)
	}
}

// STATUS asks the restore tool (--test, an aborted batch in the kernel)
// only where neither CNI-HOSTPORT-DNAT can be read over nf_tables netlink
// nor the write probe answer: with iptables-legacy tables, a tool not
// known to be iptables-nft's, a kernel before Linux 6.3. Beside the chain
// an ADD wrote, the read is the answer; on a fresh node or after a
// flush, the probe's.
func TestReady(t *testing.T) {
	b, m := memBackend()
	k := &recordingKernel{Kernel: b.Kernel}
	b.Kernel = k
	p := fixture.TestPlan(plan.IPv4, nil)
	ready := func(when string, want ...string) {
		t.Helper()
		k.calls = nil
		if err := b.Ready(p); err != nil {
			t.Errorf("%s: Ready: %v", when, err)
		}
		if !slices.Equal(k.calls, want) {
			t.Errorf("%s: Ready asked %q, want %q", when, k.calls, want)
		}
	}
	ready("a fresh node", "probe")
	m.NotWritable = nfnl.ErrNoProbe
	ready("a fresh node, no probe", "probe", "test")
	m.NotWritable = nil
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	ready("beside the chain an ADD wrote")
	m.Legacy = true
	ready("iptables-legacy", "probe", "test")
	// Where they run, the probe's failure and the test's are STATUS's.
	refused := errors.New("exit status 4")
	b.Kernel = testFails{k, refused}
	if err := b.Ready(p); !errors.Is(err, refused) {
		t.Errorf("iptables-legacy, restore --test refused: Ready = %v, want %v", err, refused)
	}
	b, m = memBackend()
	k = &recordingKernel{Kernel: b.Kernel}
	b.Kernel = k
	m.NotWritable = unix.EPERM
	if err := b.Ready(p); !errors.Is(err, unix.EPERM) || !slices.Equal(k.calls, []string{"probe"}) {
		t.Errorf("probe refused: Ready = %v after %q, want EPERM from the probe alone", err, k.calls)
	}
	// forwardAccept's rules: the probe, and the test only where it cannot.
	fw := &Accept{Family: plan.IPv4, Kernel: k}
	for _, tt := range []struct {
		notWritable error
		want        []string
	}{{nil, []string{"probe"}}, {nfnl.ErrNoProbe, []string{"probe", "test"}}} {
		m.NotWritable = tt.notWritable
		k.calls = nil
		if err := fw.Ready(p); err != nil || !slices.Equal(k.calls, tt.want) {
			t.Errorf("forwardAccept, probe %v: Ready = %v after %q, want %q", tt.notWritable, err, k.calls, tt.want)
		}
	}
}

// nftTool knows iptables-nft's restore tool by what it resolves to.
func TestNftTool(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"xtables-nft-multi", "xtables-legacy-multi", "iptables-nft-restore", "ip6tables-nft-restore", "iptables-wrapper"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, want := range map[string]bool{
		"xtables-nft-multi": true, "iptables-nft-restore": true, "ip6tables-nft-restore": true,
		"xtables-legacy-multi": false, "iptables-wrapper": false, "missing": false,
	} {
		path := filepath.Join(dir, "iptables-restore-"+link)
		if err := os.Symlink(link, path); err != nil {
			t.Fatal(err)
		}
		if got := nftTool(path); got != want {
			t.Errorf("iptables-restore -> %s: nftTool = %v, want %v", link, got, want)
		}
	}
}

// testFails is a kernel whose restore --test fails with err.
type testFails struct {
	xt.Kernel
	err error
}

func (k testFails) Test([]byte) error { return k.err }

// A fast path falls back to the slow path only when iptables-restore
// refused a line (exit status 1 or 2); the xtables lock held past -w or a
// missing permission (exit status 4) goes back to the caller at once,
// without the host-wide lock and without a second restore.
func TestFastPathsReturnUnexpectedErrors(t *testing.T) {
	held := &xt.RestoreError{Output: "Another app is currently holding the xtables lock.", Err: errors.New("exit status 4")}
	a := build(plan.IPv4, nil)
	for _, tt := range []struct {
		name string
		run  func(b *Backend, k *fakeKernel) error
	}{
		{"apply", func(b *Backend, _ *fakeKernel) error { return b.Apply(a) }},
		{"remove on iptables-legacy", func(b *Backend, _ *fakeKernel) error { return b.Remove(a) }},
		{"remove over netlink", func(b *Backend, k *fakeKernel) error {
			k.unlink = func(string) (bool, error) { return false, unix.EPERM }
			return b.Remove(a)
		}},
		{"accept apply", func(b *Backend, k *fakeKernel) error {
			return (&Accept{Family: plan.IPv4, Kernel: k, Lock: b.Lock}).Apply(a)
		}},
		{"accept remove", func(b *Backend, k *fakeKernel) error {
			return (&Accept{Family: plan.IPv4, Kernel: k, Lock: b.Lock}).Remove(a)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, k, locks := lockedBackend(t, "")
			k.err = held
			err := tt.run(b, k)
			if err == nil || *locks != 0 || len(k.restores) > 1 {
				t.Errorf("error %v, locks %d, restores %d: want the error, no lock, at most one restore", err, *locks, len(k.restores))
			}
			if !errors.Is(err, held) && !errors.Is(err, unix.EPERM) {
				t.Errorf("error %v does not wrap the cause", err)
			}
		})
	}
}
