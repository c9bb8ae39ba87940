package inventory

import (
	"net"
	"reflect"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
)

func TestFromInstalled(t *testing.T) {
	got := FromInstalled([]plan.Installed{
		{HostPort: 8080, Protocol: plan.TCP, ContainerIP: net.ParseIP("192.0.2.2"), ContainerPort: 80,
			Owner: plan.Owner{Network: "net1", ContainerID: "c1"}},
		{HostIP: net.ParseIP("198.51.100.1").To4(), HostPort: 8053, Protocol: plan.UDP, ContainerIP: net.ParseIP("192.0.2.2").To4(),
			ContainerPort: 53, Owner: plan.Owner{Network: plan.Unknown, ContainerID: plan.Unknown}},
	}, "iptables")
	want := []Entry{
		{HostIP: "*", HostPort: 8080, Protocol: "tcp", ContainerIP: "192.0.2.2", ContainerPort: 80, Network: "net1", ContainerID: "c1", Backend: "iptables"},
		{HostIP: "198.51.100.1", HostPort: 8053, Protocol: "udp", ContainerIP: "192.0.2.2", ContainerPort: 53, Network: "?", ContainerID: "?", Backend: "iptables"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FromInstalled:\n got %+v\nwant %+v", got, want)
	}
}

func TestOverlaps(t *testing.T) {
	e := Entry{HostIP: "198.51.100.1", HostPort: 80, Protocol: "tcp"}
	tests := []struct {
		ip    string
		port  int
		proto string
		want  bool
	}{
		{"198.51.100.1", 80, "tcp", true},
		{"*", 80, "tcp", true},
		{"198.51.100.2", 80, "tcp", false},
		{"198.51.100.1", 80, "udp", false},
		{"198.51.100.1", 81, "tcp", false},
	}
	for _, tt := range tests {
		if got := e.Overlaps(tt.ip, tt.port, tt.proto); got != tt.want {
			t.Errorf("Overlaps(%s, %d, %s) = %v, want %v", tt.ip, tt.port, tt.proto, got, tt.want)
		}
	}
}
