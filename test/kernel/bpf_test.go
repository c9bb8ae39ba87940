package kernel

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/bpf"
	"github.com/portmap-dev/portmap/test/nettest"
)

// TestBPFMap: pkg/bpf's map calls on the kernel, read back through
// cilium/ebpf: create and pin, batch update, dump, delete with keys
// already gone among them, the next key, the layout check.
func TestBPFMap(t *testing.T) {
	site := nettest.NewCgroupSite(t)
	m, err := bpf.NewMap(bpf.MapSpec{Name: "pm_test", Type: bpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 1 << 14, Flags: unix.BPF_F_NO_PREALLOC})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pin := filepath.Join(site.BPFFS, "m")
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}
	const n = 5000
	keys, vals := make([][8]byte, n), make([][4]byte, n)
	for i := range keys {
		binary.LittleEndian.PutUint64(keys[i][:], uint64(i)*7919)
		binary.LittleEndian.PutUint32(vals[i][:], uint32(i))
	}
	if err := bpf.BatchUpdate(m, keys, vals); err != nil {
		t.Fatal(err)
	}
	other, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var v [4]byte
	if err := other.Lookup(keys[4321], &v); err != nil || binary.LittleEndian.Uint32(v[:]) != 4321 {
		t.Errorf("cilium/ebpf reads key 4321 as %v %v", v, err)
	}

	again, err := bpf.LoadPinnedMap(pin)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	info, err := again.Info()
	if err != nil || info.Type != bpf.Hash || info.KeySize != 8 || info.ValueSize != 4 || info.Name != "pm_test" {
		t.Errorf("info %+v %v", info, err)
	}
	gotK, gotV, err := bpf.Dump[[8]byte, [4]byte](again)
	if err != nil || len(gotK) != n || len(gotV) != n {
		t.Fatalf("dump: %d keys, %d values, %v; want %d", len(gotK), len(gotV), err, n)
	}
	for i, k := range gotK {
		if binary.LittleEndian.Uint64(k[:]) != 7919*uint64(binary.LittleEndian.Uint32(gotV[i][:])) {
			t.Fatalf("dumped %x → %x", k, gotV[i])
		}
	}
	if _, _, err := bpf.Dump[[4]byte, [4]byte](again); err == nil {
		t.Error("a dump with keys of the wrong size succeeded")
	}

	// delete every key but the last, with two keys that are not there
	var gone [2][8]byte
	binary.LittleEndian.PutUint64(gone[0][:], 1)
	binary.LittleEndian.PutUint64(gone[1][:], 2)
	del := slices.Concat(keys[:100], gone[:1], keys[100:n-1], gone[1:])
	if err := bpf.DeleteAll(again, del); err != nil {
		t.Fatal(err)
	}
	var k [8]byte
	if err := again.NextKey(nil, k[:]); err != nil || k != keys[n-1] {
		t.Errorf("first key after the delete: %x %v, want %x", k, err, keys[n-1])
	}
	if err := again.NextKey(k[:], k[:]); !errors.Is(err, bpf.ErrKeyNotExist) {
		t.Errorf("the key after the last: %v, want ErrKeyNotExist", err)
	}
	if err := again.Lookup(keys[0][:], v[:]); !errors.Is(err, bpf.ErrKeyNotExist) {
		t.Errorf("lookup of a deleted key: %v", err)
	}
	if err := again.Update(keys[0][:], v[:]); err != nil {
		t.Error(err)
	}
	if err := again.Delete(keys[0][:]); err != nil {
		t.Error(err)
	}
	if _, err := bpf.LoadPinnedMap(filepath.Join(site.BPFFS, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a pin that is not there: %v, want ErrNotExist", err)
	}
}

// TestBPFLink: a program loaded by pkg/bpf, attached to the test's
// cgroup through a link, pinned, read back (cilium/ebpf sees it attached),
// updated in place, detached; a program the verifier refuses names the
// verifier's complaint.
func TestBPFLink(t *testing.T) {
	site := nettest.NewCgroupSite(t)
	if err := bpf.HaveProgramHelper(bpf.CGroupSockAddr, bpf.AttachInet4Connect, bpf.FnGetNetnsCookie); err != nil {
		t.Fatalf("this kernel has bpf_get_netns_cookie for cgroup socket-address programs: %v", err)
	}
	load := func(name string) *bpf.Prog {
		p, err := bpf.NewProgram(bpf.ProgramSpec{Name: name, Type: bpf.CGroupSockAddr, AttachType: bpf.AttachInet4Connect,
			License: "Apache-2.0", Insns: bpf.Program{bpf.MovImm(bpf.R0, 1), bpf.Exit()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	first, second := load("pm_first"), load("pm_second")
	cg, err := os.Open(site.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	l, err := bpf.AttachCgroup(int(cg.Fd()), first, bpf.AttachInet4Connect)
	if err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(site.BPFFS, "link")
	if err := l.Pin(pin); err != nil {
		t.Fatal(err)
	}
	l.Close()

	var st unix.Stat_t
	if err := unix.Stat(site.Cgroup, &st); err != nil {
		t.Fatal(err)
	}
	named := func() string {
		t.Helper()
		l, err := bpf.LoadPinnedLink(pin)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		info, err := l.Info()
		if err != nil || info.Type != bpf.LinkCgroup || info.CgroupID != st.Ino {
			t.Fatalf("link info %+v %v, want a cgroup link on cgroup %d", info, err, st.Ino)
		}
		p, err := bpf.ProgramFromID(info.ProgID)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		name, err := p.Name()
		if err != nil {
			t.Fatal(err)
		}
		return name
	}
	if got := named(); got != "pm_first" {
		t.Errorf("attached %q, want pm_first", got)
	}
	attached := func() int {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Programs)
	}
	if n := attached(); n != 1 {
		t.Errorf("cilium/ebpf finds %d programs on connect4, want 1", n)
	}

	l, err = bpf.LoadPinnedLink(pin)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Update(second); err != nil {
		t.Fatal(err)
	}
	if got := named(); got != "pm_second" {
		t.Errorf("after the update %q, want pm_second", got)
	}
	if err := l.Detach(); err != nil {
		t.Fatal(err)
	}
	if n := attached(); n != 0 {
		t.Errorf("%d programs on connect4 after the detach, want 0", n)
	}

	_, err = bpf.NewProgram(bpf.ProgramSpec{Name: "pm_bad", Type: bpf.CGroupSockAddr, AttachType: bpf.AttachInet4Connect,
		License: "Apache-2.0", Insns: bpf.Program{bpf.Exit()}})
	if err == nil || !strings.Contains(err.Error(), "verifier: ") || !strings.Contains(err.Error(), "R0") {
		t.Errorf("a program returning an unset R0: %v, want the verifier's words about R0", err)
	}
}
