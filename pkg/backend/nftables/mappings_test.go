package nftables

import (
	"net"
	"os"
	"reflect"
	"sort"
	"strconv"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
)

func TestForwardsOfListing(t *testing.T) {
	b, err := os.ReadFile("testdata/forwards-list.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := forwardsOf(parseListing(plan.IPv6, string(b)))
	sort.Slice(got, func(i, j int) bool { return got[i].HostPort < got[j].HostPort })
	c2 := plan.Owner{Network: "net1", ContainerID: "c2"}
	want := []plan.Installed{
		{HostPort: 8054, HostIP: net.ParseIP("2001:db8::1"), Protocol: plan.UDP, ContainerIP: net.ParseIP("2001:db8::2"), ContainerPort: 54, Owner: c2},
		{HostPort: 8080, Protocol: plan.TCP, ContainerIP: net.ParseIP("2001:db8::2"), ContainerPort: 80, Owner: c2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseMappings:\n got %+v\nwant %+v", got, want)
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
