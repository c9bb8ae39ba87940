package socket

import (
	"errors"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
	"golang.org/x/sys/unix"
)

// TestReadyByteOrder: on a big-endian machine the socket path is not
// served, and says so before anything else; on a little-endian one the
// byte order is never the reason (qemu-user runs this for s390x in
// make cross-test).
func TestReadyByteOrder(t *testing.T) {
	s, err := OpenSite(plan.Socket{CgroupPath: t.TempDir(), PinDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Ready()
	if bigEndian() != errors.Is(err, errBigEndian) {
		t.Errorf("Ready on a machine big-endian %v: %v", bigEndian(), err)
	}
}

// TestLockedMemory: a creation refused with EPERM under a finite
// RLIMIT_MEMLOCK (a kernel before 5.11 whose limit is spent) is run again
// with the limit lifted, once; one refused for another reason, or where
// the limit cannot be lifted, is not run again. (The test lowers and
// lifts only its own process's soft limit.)
func TestLockedMemory(t *testing.T) {
	var saved unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &saved); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_MEMLOCK, &saved) })
	const need = 128 << 10
	if saved.Max < need {
		t.Fatalf("RLIMIT_MEMLOCK's hard limit is %d: no room to test", saved.Max)
	}
	// as a pre-5.11 kernel: EPERM while the limit is under need
	calls := 0
	create := func() error {
		calls++
		var lim unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
			return err
		}
		if lim.Cur < need {
			return unix.EPERM
		}
		return nil
	}
	lower := func() {
		t.Helper()
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 64 << 10, Max: saved.Max}); err != nil {
			t.Fatal(err)
		}
	}
	lower()
	if err := lockedMemory(create); err != nil || calls != 2 {
		t.Errorf("a creation refused under a spent limit: %v after %d calls; want success after 2", err, calls)
	}
	lower()
	calls = 0
	if err := lockedMemory(func() error { calls++; return unix.EINVAL }); !errors.Is(err, unix.EINVAL) || calls != 1 {
		t.Errorf("another refusal: %v after %d calls; want EINVAL after 1", err, calls)
	}
	// at the hard limit already, without the privilege to go past it
	// (or with no limit at all): the EPERM is not the limit's to lift
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: saved.Max, Max: saved.Max}); err != nil {
		t.Fatal(err)
	}
	var lim unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
	calls = 0
	err := lockedMemory(func() error { calls++; return unix.EPERM })
	if !errors.Is(err, unix.EPERM) || calls > 2 {
		t.Errorf("EPERM at the limit: %v after %d calls; want EPERM after at most 2", err, calls)
	}
}
