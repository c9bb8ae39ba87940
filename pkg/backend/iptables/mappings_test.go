package iptables

import (
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
)

func TestParseForwards(t *testing.T) {
	b, err := os.ReadFile("testdata/forwards-S.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := parseMappings(strings.Split(strings.TrimSpace(string(b)), "\n"))
	c1 := plan.Owner{Network: "net1", ContainerID: "c1"}
	want := []plan.Installed{
		{HostPort: 8080, Protocol: plan.TCP, ContainerIP: net.ParseIP("192.0.2.2"), ContainerPort: 80, Owner: c1},
		{HostIP: net.ParseIP("198.51.100.1"), HostPort: 8053, Protocol: plan.UDP, ContainerIP: net.ParseIP("192.0.2.2"), ContainerPort: 53, Owner: c1},
		// A chain without an entry rule: what it forwards, owner unknown.
		{HostPort: 9000, Protocol: plan.SCTP, ContainerIP: net.ParseIP("192.0.2.9"), ContainerPort: 9000,
			Owner: plan.Owner{Network: plan.Unknown, ContainerID: plan.Unknown}},
	}
	if len(got) != len(want) {
		t.Fatalf("ParseMappings: %d mappings %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(norm(got[i]), norm(want[i])) {
			t.Errorf("mapping %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

// norm spells addresses in one form, so 4-in-6 and 4-byte IPs compare.
func norm(f plan.Installed) plan.Installed {
	if f.HostIP != nil {
		f.HostIP = net.ParseIP(f.HostIP.String())
	}
	f.ContainerIP = net.ParseIP(f.ContainerIP.String())
	return f
}

func TestForwardsReadsItsOwnRendering(t *testing.T) {
	// What this backend writes, as iptables prints it (testdata of the
	// sync tests), reads back as the plans that wrote it.
	b, k := syncBackend(t, "")
	fs, err := b.Mappings()
	if err != nil || len(k.restores) != 0 {
		t.Fatalf("Forwards: %v, restores %q", err, k.restores)
	}
	got := map[string]string{}
	for _, f := range fs {
		got[f.Owner.ContainerID+" "+string(f.Protocol)+" "+strconv.Itoa(f.HostPort)] = f.ContainerIP.String()
	}
	want := map[string]string{"a tcp 8080": "192.0.2.2", "a udp 8053": "192.0.2.2", "b tcp 9090": "192.0.2.3", "o tcp 7070": "192.0.2.4"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Forwards: %v, want %v", got, want)
	}
}
