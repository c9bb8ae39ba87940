package nftables

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// fakeKernel is the in-memory kernel with a record of what the backend
// asked of it: every transaction as the nft script it renders (applied
// unless fail says true for it: then it fails as the kernel would, with
// errno or EEXIST, and changes nothing), the transactions it validated,
// its reads of one chain and its write probes.
type fakeKernel struct {
	*Memory
	scripts []string
	checks  []string
	fail    func(script string) bool
	errno   unix.Errno
	// chainReads counts the chains read with their rules.
	chainReads int
	// probes counts Writable's calls; notWritable is their answer.
	probes      int
	notWritable error
}

func (k *fakeKernel) Apply(tx *nft.Tx) error {
	s := tx.Text()
	k.scripts = append(k.scripts, s)
	if k.fail != nil && k.fail(s) {
		errno := k.errno
		if errno == 0 {
			errno = unix.EEXIST
		}
		return &nft.Error{Op: tx.String(), Err: errno}
	}
	return k.Memory.Apply(tx)
}

func (k *fakeKernel) Writable(plan.Family) error {
	k.probes++
	return k.notWritable
}

func (k *fakeKernel) Validate(tx *nft.Tx) error {
	k.checks = append(k.checks, tx.Text())
	return k.Memory.Validate(tx)
}

func (k *fakeKernel) Read(f plan.Family, q Query) (*State, error) {
	k.chainReads += len(q.Chains)
	return k.Memory.Read(f, q)
}

// seed applies plans through a backend of their own and forgets that it
// did: the node as the tests begin.
func (k *fakeKernel) seed(t *testing.T, plans ...*plan.Plan) {
	t.Helper()
	b := &Backend{Family: plan.IPv4, Kernel: k.Memory, Lock: func() (func(), error) { return func() {}, nil }}
	for _, p := range plans {
		if err := b.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
}

// upstreamRule writes a rule of upstream portmap's nftables layout: in
// chain hostports of table cni_hostport, proto dport to ip:port,
// commented with the container's ID. It returns the rule's handle.
func (k *fakeKernel) upstreamRule(t *testing.T, p plan.Protocol, dport int, ip string, port int, id string) uint64 {
	t.Helper()
	tx := nft.NewTx(nft.IPv4, upstreamTable)
	tx.Add(&nft.Table{})
	tx.Add(&nft.Chain{Name: "hostports"})
	tx.Add(&nft.Rule{Chain: "hostports", Comment: id, Stmts: []nft.Stmt{nft.L4Proto{Name: string(p)}, nft.DPort{Port: dport, Last: 0}, nft.DNATTo(net.ParseIP(ip).To4(), port)}})
	if err := k.Memory.Apply(tx); err != nil {
		t.Fatal(err)
	}
	st, err := k.Memory.Table(plan.IPv4, upstreamTable)
	if err != nil || st == nil || st.Chains["hostports"] == nil || len(st.Chains["hostports"].Rules) == 0 {
		t.Fatalf("upstream's table: %v, %v", st, err)
	}
	c := st.Chains["hostports"]
	return c.Rules[len(c.Rules)-1].Handle
}
