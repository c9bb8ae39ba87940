package attach

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// rangeRequest is a request with one Podman-style range of n ports, in
// the bench's spelling.
func rangeRequest(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"cniVersion": "1.0.0", "name": "net1", "type": "portmap", "backend": "nftables", "runtimeConfig": {"portMappings": [`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `{"hostPort": %d, "containerPort": %d, "protocol": "tcp"}`, 20000+i, 20000+i)
	}
	b.WriteString(`]}, "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/run/netns/c"}], "ips": [{"address": "192.0.2.2/24", "interface": 0}]}}`)
	return []byte(b.String())
}

// BenchmarkParseRange: the request of a range of 5000 ports, parsed.
func BenchmarkParseRange(b *testing.B) {
	req := rangeRequest(5000)
	b.SetBytes(int64(len(req)))
	for b.Loop() {
		if _, err := Parse(req, "eth0", "nftables"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadRange: the request of a range of 5000 ports as
// encoding/json writes it (libcni's), read from a source and decoded.
func BenchmarkReadRange(b *testing.B) {
	req := []byte(strings.ReplaceAll(strings.ReplaceAll(string(rangeRequest(5000)), ", ", ","), ": ", ":"))
	b.SetBytes(int64(len(req)))
	for b.Loop() {
		c, _, err := Read(bytes.NewReader(req), "eth0", "nftables")
		if err != nil || c.Request.Mappings.Len() != 5000 {
			b.Fatal("not read", err)
		}
	}
}
