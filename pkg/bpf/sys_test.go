package bpf

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestAttrLayouts holds the bpf_attr members to the kernel's offsets
// (include/uapi/linux/bpf.h): a field in the wrong place is a request the
// kernel reads otherwise, or refuses.
func TestAttrLayouts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"map_create.map_name", unsafe.Offsetof(mapCreateAttr{}.MapName), 28},
		{"map_create size", unsafe.Sizeof(mapCreateAttr{}), 44},
		{"elem.key", unsafe.Offsetof(elemAttr{}.Key), 8},
		{"elem.value", unsafe.Offsetof(elemAttr{}.Value), 16},
		{"elem.flags", unsafe.Offsetof(elemAttr{}.Flags), 24},
		{"batch.keys", unsafe.Offsetof(batchAttr{}.Keys), 16},
		{"batch.count", unsafe.Offsetof(batchAttr{}.Count), 32},
		{"batch.map_fd", unsafe.Offsetof(batchAttr{}.MapFD), 36},
		{"batch.elem_flags", unsafe.Offsetof(batchAttr{}.ElemFlags), 40},
		{"prog_load.license", unsafe.Offsetof(progLoadAttr{}.License), 16},
		{"prog_load.log_buf", unsafe.Offsetof(progLoadAttr{}.LogBuf), 32},
		{"prog_load.prog_name", unsafe.Offsetof(progLoadAttr{}.ProgName), 48},
		{"prog_load.expected_attach_type", unsafe.Offsetof(progLoadAttr{}.ExpectedAttachType), 68},
		{"obj.bpf_fd", unsafe.Offsetof(objAttr{}.BpfFD), 8},
		{"info.info", unsafe.Offsetof(infoAttr{}.Info), 8},
		{"link_create.attach_type", unsafe.Offsetof(linkCreateAttr{}.AttachType), 8},
		{"link_update.old_prog_fd", unsafe.Offsetof(linkUpdateAttr{}.OldProgFD), 12},
	} {
		if tc.got != tc.want {
			t.Errorf("%s at %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}

func TestNames(t *testing.T) {
	n := objName("pm_c4_1a2b3c4d_and_more")
	if got := cString(n[:]); got != "pm_c4_1a2b3c4d_" {
		t.Errorf("a long name: %q, want its first 15 bytes", got)
	}
	if got := cString([]byte("abc")); got != "abc" {
		t.Errorf("a name without its NUL: %q", got)
	}
}

func TestRaw(t *testing.T) {
	if raw[[4]byte](nil) != nil {
		t.Error("raw of no elements is not nil")
	}
	b := raw([][2]byte{{1, 2}, {3, 4}})
	if len(b) != 4 || b[0] != 1 || b[3] != 4 {
		t.Errorf("raw: %v", b)
	}
	if err := sized[[4]byte](8, "keys"); err == nil {
		t.Error("4-byte keys for a map of 8: no error")
	}
	if err := sized[[8]byte](8, "keys"); err != nil {
		t.Error(err)
	}
	m := &Map{object: object{fd: -1}, keySize: 8, valueSize: 4}
	if err := m.Lookup(make([]byte, 4), make([]byte, 4)); err == nil {
		t.Error("a 4-byte key for a map of 8-byte keys: no error")
	}
	if err := BatchUpdate(m, make([][8]byte, 2), make([][4]byte, 1)); err == nil {
		t.Error("2 keys, 1 value: no error")
	}
	if err := (&object{fd: -1}).Close(); err != nil {
		t.Errorf("closing a closed object: %v", err)
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
	create := func() (int, error) {
		calls++
		var lim unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
			return -1, err
		}
		if lim.Cur < need {
			return -1, unix.EPERM
		}
		return 7, nil
	}
	lower := func() {
		t.Helper()
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 64 << 10, Max: saved.Max}); err != nil {
			t.Fatal(err)
		}
	}
	lower()
	if fd, err := lockedMemory(create); fd != 7 || err != nil || calls != 2 {
		t.Errorf("a creation refused under a spent limit: fd %d, %v after %d calls; want 7 after 2", fd, err, calls)
	}
	lower()
	calls = 0
	if _, err := lockedMemory(func() (int, error) { calls++; return -1, unix.EINVAL }); !errors.Is(err, unix.EINVAL) || calls != 1 {
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
	_, err := lockedMemory(func() (int, error) { calls++; return -1, unix.EPERM })
	if !errors.Is(err, unix.EPERM) || calls > 2 {
		t.Errorf("EPERM at the limit: %v after %d calls; want EPERM after at most 2", err, calls)
	}
}
