package nftables

import (
	"net"
	"reflect"
	"sort"
	"strconv"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// TestForwardsIPv6: what an IPv6 node forwards, read back from its
// table: a port of every host address, and one of a host address.
func TestForwardsIPv6(t *testing.T) {
	c2 := plan.Owner{Network: "net1", ContainerID: "c2", IfName: "eth0"}
	p := plan.Build(plan.Request{Owner: c2, Masquerade: plan.Masquerade{Enabled: true, MarkBit: 13},
		Mappings: plan.MappingsOf(plan.Mapping{HostPort: 8080, ContainerPort: 80, Protocol: plan.TCP},
			plan.Mapping{HostPort: 8054, ContainerPort: 54, Protocol: plan.UDP, HostIP: net.ParseIP("2001:db8::1")})},
		plan.IPv6, &net.IPNet{IP: net.ParseIP("2001:db8::2"), Mask: net.CIDRMask(64, 128)})
	c2.IfName = "" // the comment's interface is not read back
	m := NewMemory()
	b := &Backend{Family: plan.IPv6, Kernel: m, Lock: func() (func(), error) { return func() {}, nil }}
	if err := b.Apply(p); err != nil {
		t.Fatal(err)
	}
	got, err := b.Mappings()
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(got, func(i, j int) bool { return got[i].HostPort < got[j].HostPort })
	want := []plan.Installed{
		{HostPort: 8054, HostIP: net.ParseIP("2001:db8::1"), Protocol: plan.UDP, ContainerIP: net.ParseIP("2001:db8::2"), ContainerPort: 54, Owner: c2},
		{HostPort: 8080, Protocol: plan.TCP, ContainerIP: net.ParseIP("2001:db8::2"), ContainerPort: 80, Owner: c2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Mappings:\n got %+v\nwant %+v", got, want)
	}
}

func TestForwardsReadsItsOwnRendering(t *testing.T) {
	b, _ := syncBackend(t, true)
	fs, err := b.Mappings()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range fs {
		got[f.Owner.ContainerID+" "+string(f.Protocol)+" "+strconv.Itoa(f.HostPort)] = f.ContainerIP.String()
	}
	want := map[string]string{"a tcp 8080": "192.0.2.2", "a udp 8053": "192.0.2.2", "b tcp 9090": "192.0.2.3", "o tcp 7070": "192.0.2.4"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Forwards: %v, want %v", got, want)
	}
	// A missing table forwards nothing, and is no error.
	b, _ = syncBackend(t, false)
	if fs, err := b.Mappings(); err != nil || fs != nil {
		t.Errorf("missing table: %v, %v", fs, err)
	}
}
