package portmap

import (
	"bytes"
	"flag"
	"os"
	"testing"

	"github.com/portmap-dev/portmap/pkg/inventory"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestWriteTableGolden(t *testing.T) {
	entries := []inventory.Entry{
		{HostIP: "*", HostPort: 8080, Protocol: "tcp", ContainerIP: "192.0.2.2", ContainerPort: 80, Network: "net1", ContainerID: "c1", Backend: "iptables"},
		{HostIP: "198.51.100.1", HostPort: 8053, Protocol: "udp", ContainerIP: "2001:db8::2", ContainerPort: 53, Network: "a-longer-network", ContainerID: "0123456789abcdef", Backend: "nftables"},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, entries); err != nil {
		t.Fatal(err)
	}
	const path = "testdata/list.golden"
	if *update {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update to create): %v", err)
	}
	if b.String() != string(want) {
		t.Errorf("table differs from %s:\n--- got\n%s--- want\n%s", path, b.String(), want)
	}
}

func TestListRejectsUnknownArgument(t *testing.T) {
	if err := List(&bytes.Buffer{}, []string{"--yaml"}); err == nil {
		t.Error("List accepted --yaml")
	}
}
