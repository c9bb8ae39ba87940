package kernel

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/test/nettest"
)

// firstNFTError records the error of the first transaction of each verb.
type firstNFTError struct {
	nftables.Kernel
	errs []error
}

func (k *firstNFTError) Apply(tx *nftables.Tx) error {
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
			t.Fatalf("%s: first transaction %v (of %d), want %v and a slow path after it", what, k.errs, len(k.errs), want)
		}
	}
	a := mkPlan("net1", "a", "192.0.2.2/24", 8080)
	first(t, "ADD on a fresh node (no maps)", func() error { return b.Apply(a) }, unix.ENOENT)
	first(t, "re-ADD (the chain exists)", func() error { return b.Apply(a) }, unix.EEXIST)
	c := mkPlan("net1", "c", "192.0.2.3/24", 8080)
	first(t, "ADD of a held port (the element exists)", func() error { return b.Apply(c) }, unix.EEXIST)
	first(t, "DEL of a port taken over", func() error { return b.Remove(a) }, unix.EEXIST)
	if err := b.Remove(c); err != nil {
		t.Fatal(err)
	}
}

// firstRestoreError records every restore's error.
type firstRestoreError struct {
	iptables.Kernel
	errs []error
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
	if len(k.errs) < 2 || !iptables.Refused(k.errs[0]) {
		t.Fatalf("re-ADD (the chain exists): first restore %v, want refused (exit status 1 or 2) and a slow path after it", k.errs)
	}
	if err := b.Remove(a); err != nil {
		t.Fatal(err)
	}
}
