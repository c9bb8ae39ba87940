package kernel

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/portmap-dev/portmap/pkg/backend/socket"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

// TestSocketSiteMaps: the socket path's maps on the kernel, through the
// site (cilium/ebpf's batch calls) and read back by cilium/ebpf on its
// own: 5000 entries written in one batch and read back in more than one,
// a delete with keys already gone among them, the lookup of one
// attachment's keys, Retire refusing while an entry remains and removing
// every pin once none does.
func TestSocketSiteMaps(t *testing.T) {
	socketKernel(t)
	site := nettest.NewCgroupSite(t)
	cfg := plan.Socket{CgroupPath: site.Cgroup, PinDir: site.PinDir}
	t.Cleanup(func() { _ = socket.Uninstall(cfg) })
	s, err := socket.OpenSite(cfg)
	if err != nil {
		t.Fatal(err)
	}
	states, err := s.Hooks()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Install(states); err != nil {
		t.Fatal(err)
	}

	const netns, n, id = 4242, 5000, 77
	var put []socket.Entry
	for i := range n {
		k := socket.Key{Netns: netns, Port: uint16(10000 + i), Protocol: plan.TCP}
		k.Addr[10], k.Addr[11], k.Addr[12] = 0xff, 0xff, 127
		k.Addr[15] = 1
		v := socket.Value{Port: uint16(i), Rank: socket.RankWildcard, Owner: id, Network: 9}
		v.Addr[10], v.Addr[11], v.Addr[12] = 0xff, 0xff, 10
		v.Addr[15] = byte(i)
		put = append(put, socket.Entry{Key: k, Value: v})
	}
	owner := plan.Owner{Network: "net", ContainerID: "c1", IfName: "eth0"}
	if err := s.Write(netns, plan.IPv4, &socket.Write{Put: put, PutOwners: map[uint64]plan.Owner{id: owner}}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Read(netns, plan.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Entries) != n || st.Owners[id] != owner {
		t.Fatalf("read back %d entries and owner %+v, want %d and %+v", len(st.Entries), st.Owners[id], n, owner)
	}
	for _, e := range put {
		if st.Entries[e.Key] != e.Value {
			t.Fatalf("entry %+v read back as %+v, want %+v", e.Key, st.Entries[e.Key], e.Value)
		}
	}
	if other, err := s.Read(netns+1, plan.IPv4); err != nil || len(other.Entries) != 0 {
		t.Errorf("another namespace's entries: %d, %v; want none", len(other.Entries), err)
	}
	svc, err := ebpf.LoadPinnedMap(filepath.Join(site.PinDir, socket.Layout, "svc"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	count := func() int {
		t.Helper()
		c := 0
		var k, v []byte
		for it := svc.Iterate(); it.Next(&k, &v); {
			c++
		}
		return c
	}
	if c := count(); c != n {
		t.Errorf("cilium/ebpf iterates %d entries, want %d", c, n)
	}

	// delete every key but the last, with two that are not there among them
	gone := []socket.Key{{Netns: netns, Port: 1, Protocol: plan.TCP}, {Netns: netns, Port: 2, Protocol: plan.UDP}}
	var keys []socket.Key
	for _, e := range put {
		keys = append(keys, e.Key)
	}
	del := slices.Concat(keys[:100], gone[:1], keys[100:n-1], gone[1:])
	if err := s.Write(netns, plan.IPv4, &socket.Write{Delete: del}); err != nil {
		t.Fatal(err)
	}
	if c := count(); c != 1 {
		t.Errorf("%d entries after the delete, want 1", c)
	}
	st, err = s.ReadKeys(netns, plan.IPv4, []socket.Key{keys[0], keys[n-1]}, id)
	if err != nil || len(st.Entries) != 1 || st.Entries[keys[n-1]] != put[n-1].Value || st.Owners[id] != owner {
		t.Errorf("lookup of a deleted and a kept key: %+v, %v; want the kept one and the owner", st, err)
	}
	if done, err := s.Retire(); done || err != nil {
		t.Errorf("Retire with an entry left: %v, %v; want false", done, err)
	}
	if err := s.Write(netns, plan.IPv4, &socket.Write{Delete: keys[n-1:], DelOwners: []uint64{id}}); err != nil {
		t.Fatal(err)
	}
	if done, err := s.Retire(); !done || err != nil {
		t.Errorf("Retire with nothing left: %v, %v; want true", done, err)
	}
	if _, err := os.Stat(filepath.Join(site.PinDir, socket.Layout)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the layout directory after Retire: %v, want gone", err)
	}
}
