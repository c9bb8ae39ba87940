package cli

import (
	"bytes"
	"testing"

	"github.com/portmap-dev/portmap/test/fixture"

	"github.com/portmap-dev/portmap/pkg/inventory"
)

func TestWriteTableGolden(t *testing.T) {
	entries := []inventory.Entry{
		{HostIP: "*", HostPort: 8080, Protocol: "tcp", ContainerIP: "192.0.2.2", ContainerPort: 80, Network: "net1", ContainerID: "c1", Backend: "iptables"},
		{HostIP: "198.51.100.1", HostPort: 8053, Protocol: "udp", ContainerIP: "2001:db8::2", ContainerPort: 53, Network: "a-longer-network", ContainerID: "0123456789abcdef", Backend: "nftables"},
	}
	var b bytes.Buffer
	if err := writeTable(&b, entries); err != nil {
		t.Fatal(err)
	}
	fixture.Golden(t, "testdata/list.golden", b.String())
}
