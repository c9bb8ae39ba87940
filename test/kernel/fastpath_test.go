package kernel

import (
	"errors"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/test/nettest"
)

// firstNFTError records the error of the first transaction of each verb.
type firstNFTError struct {
	nftables.Kernel
	errs []error
}

func (k *firstNFTError) Apply(tx *nft.Tx) error {
	err := k.Kernel.Apply(tx)
	k.errs = append(k.errs, err)
	return err
}

// The fast paths fall back only on the errors the kernel gives for the
// states they expect; these are those errors, from the real kernel.
func TestNFTFastPathMisses(t *testing.T) {
	nettest.ResetNAT(t)
	b, _ := nftBackend(t, 4)
	k := &firstNFTError{Kernel: b.Kernel}
	b.Kernel = k
	first := func(t *testing.T, what string, do func() error, want unix.Errno) {
		t.Helper()
		k.errs = nil
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(k.errs) < 2 || !errors.Is(k.errs[0], want) {
			out, _ := exec.Command("nft", "list", "table", "ip", nftables.Table).CombinedOutput()
			t.Fatalf("%s: first transaction %v (of %d), want %v and a slow path after it; the table then:\n%s", what, k.errs, len(k.errs), want, out)
		}
	}
	x := mkPlan("net1", "x", "192.0.2.9/24", 8090)
	x.Masquerade.MarkBit = 14 // not flat: a chain reached from the verdict maps
	first(t, "ADD on a fresh node (no maps)", func() error { return b.Apply(x) }, unix.ENOENT)
	// A flat ADD reads the shared chains it relies on before it writes
	// (here mark bit 13's are missing): one transaction, the slow path's.
	a := mkPlan("net1", "a", "192.0.2.2/24", 8080)
	k.errs = nil
	if err := b.Apply(a); err != nil || len(k.errs) != 1 || k.errs[0] != nil {
		t.Fatalf("flat ADD beside another bit's skeleton: %v, transactions %v, want one", err, k.errs)
	}
	// ADD again and ADD of a held port read their chain and keys before
	// they write, so the kernel refuses no batch of theirs (each refusal
	// costs an RCU grace period): one transaction, the slow path's. The
	// fast path's batch still meets such a state where another ADD came
	// between the read and the write: the kernel's answers are these.
	c := mkPlan("net1", "c", "192.0.2.3/24", 8080)
	for _, tt := range []struct {
		what string
		p    *plan.Plan
	}{{"re-ADD (the chain exists)", a}, {"ADD of a held port (the element exists)", c}} {
		k.errs = nil
		if err := b.Apply(tt.p); err != nil || len(k.errs) != 1 || k.errs[0] != nil {
			t.Fatalf("%s: %v, transactions %v, want one", tt.what, err, k.errs)
		}
	}
	held := nftables.Key{Protocol: plan.TCP, Port: 8080, Flat: true}
	for what, o := range map[string]nft.Object{
		"a chain that exists": &nft.Chain{Name: nftables.ChainName(a.Owner)},
		"an element of a held key": nftables.Element{Key: held, Chain: nftables.ChainName(a.Owner),
			To: netip.MustParseAddrPort("192.0.2.2:80"), Srcs: []string{"192.0.2.0/24"}},
	} {
		tx := nft.NewTx(nft.IPv4, nftables.Table)
		tx.Create(o)
		if err := k.Kernel.Apply(tx); !errors.Is(err, unix.EEXIST) {
			t.Errorf("creating %s: %v, want %v", what, err, unix.EEXIST)
		}
	}
	// DEL of single ports has one path: its keys' elements read under
	// the lock, then one transaction that releases only its own.
	k.errs = nil
	if err := b.Remove(a); err != nil {
		t.Fatalf("DEL of a port taken over: %v", err)
	}
	if len(k.errs) != 1 || k.errs[0] != nil {
		t.Fatalf("DEL of a port taken over: transactions %v, want one", k.errs)
	}
	if err := b.Check(c); err != nil {
		t.Errorf("the port's new owner after the old one's DEL: %v", err)
	}
	if err := b.Remove(c); err != nil {
		t.Fatal(err)
	}
	// A range's DEL tries its fast path first; an interval another ADD
	// cut down makes it fail.
	span := func(id, ip string, from, to int) *plan.Plan {
		req := plan.Request{
			Owner:      plan.Owner{Network: "net1", ContainerID: id, IfName: "eth0"},
			Masquerade: plan.Masquerade{Enabled: true, MarkBit: 13},
		}
		for port := from; port <= to; port++ {
			req.Mappings.Add(plan.Mapping{HostPort: port, ContainerPort: port, Protocol: plan.TCP})
		}
		n := cidr(ip)
		return plan.Build(req, plan.FamilyOf(n.IP), n)
	}
	r := span("r", "192.0.2.4/24", 9100, 9199)
	s := span("s", "192.0.2.5/24", 9150, 9249)
	for _, p := range []*plan.Plan{r, s} {
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	// Linux 6.x refuses the fast path's re-add of the interval that was
	// cut down (EEXIST) and the slow path follows; 5.10 takes the fast
	// path's transaction whole: either way what is left is the newer
	// range, and nothing of r
	k.errs = nil
	if err := b.Remove(r); err != nil {
		t.Fatalf("DEL of a range cut down: %v", err)
	}
	if len(k.errs) == 0 || k.errs[0] != nil && (!errors.Is(k.errs[0], unix.EEXIST) || len(k.errs) < 2) {
		t.Fatalf("DEL of a range cut down: transactions %v, want one that passed, or EEXIST and a slow path after it", k.errs)
	}
	if out, _ := exec.Command("nft", "list", "table", "ip", nftables.Table).CombinedOutput(); strings.Contains(string(out), nftables.ChainName(r.Owner)) {
		t.Errorf("DEL of a range cut down left its chain or an element:\n%s", out)
	}
	if err := b.Check(s); err != nil {
		t.Errorf("the newer range after the older one's DEL: %v", err)
	}
	if err := b.Remove(s); err != nil {
		t.Fatal(err)
	}
}

// firstRestoreError records the error of every restore and native
// transaction.
type firstRestoreError struct {
	xt.Kernel
	errs []error
}

func (k *firstRestoreError) AddChain(marker, chain string, rules, entries []xt.Rule, jumps ...string) error {
	err := k.Kernel.AddChain(marker, chain, rules, entries, jumps...)
	k.errs = append(k.errs, err)
	return err
}

func (k *firstRestoreError) Restore(p []byte) error {
	err := k.Kernel.Restore(p)
	k.errs = append(k.errs, err)
	return err
}

func TestIPTablesFastPathMisses(t *testing.T) {
	nettest.ResetNAT(t)
	b, _ := backend(t, 4)
	k := &firstRestoreError{Kernel: b.Kernel}
	b.Kernel = k
	a := mkPlan("net1", "a", "192.0.2.2/24", 8080)
	// On a fresh node the shared rules read over netlink are missing: ADD
	// goes to the slow path without trying the fast one (one restore).
	k.errs = nil
	if err := b.Apply(a); err != nil {
		t.Fatalf("ADD on a fresh node: %v", err)
	}
	if len(k.errs) != 1 || k.errs[0] != nil {
		t.Fatalf("ADD on a fresh node: restores %v, want the slow path's one", k.errs)
	}
	k.errs = nil
	if err := b.Apply(a); err != nil {
		t.Fatalf("re-ADD: %v", err)
	}
	if len(k.errs) < 2 || !iptables.Missed(k.errs[0]) {
		t.Fatalf("re-ADD (the chain exists): first transaction %v, want refused (EEXIST from the native one) and a slow path after it", k.errs)
	}
	if err := b.Remove(a); err != nil {
		t.Fatal(err)
	}
}
