package inventory

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestParseIPTables(t *testing.T) {
	b, err := os.ReadFile("testdata/iptables-S.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := ParseIPTables(strings.Split(strings.TrimSpace(string(b)), "\n"))
	want := []Entry{
		{HostIP: "*", HostPort: 8080, Protocol: "tcp", ContainerIP: "192.0.2.2", ContainerPort: 80, Network: "net1", ContainerID: "c1", Backend: "iptables"},
		{HostIP: "198.51.100.1", HostPort: 8053, Protocol: "udp", ContainerIP: "192.0.2.2", ContainerPort: 53, Network: "net1", ContainerID: "c1", Backend: "iptables"},
		// A chain without an entry rule: what it forwards, owner unknown.
		{HostIP: "*", HostPort: 9000, Protocol: "sctp", ContainerIP: "192.0.2.9", ContainerPort: 9000, Network: "?", ContainerID: "?", Backend: "iptables"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseIPTables:\n got %+v\nwant %+v", got, want)
	}
}

func TestParseNFTables(t *testing.T) {
	b, err := os.ReadFile("testdata/nft-list.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := ParseNFTables(string(b))
	want := []Entry{
		{HostIP: "*", HostPort: 8080, Protocol: "tcp", ContainerIP: "2001:db8::2", ContainerPort: 80, Network: "net1", ContainerID: "c2", Backend: "nftables"},
		{HostIP: "2001:db8::1", HostPort: 8054, Protocol: "udp", ContainerIP: "2001:db8::2", ContainerPort: 54, Network: "net1", ContainerID: "c2", Backend: "nftables"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseNFTables:\n got %+v\nwant %+v", got, want)
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
