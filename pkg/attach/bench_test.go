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
// encoding/json writes it (libcni's), decoded as it is read from a
// source a window at a time (into memory reserved once: a plugin reads
// one request, into memory the kernel hands it zeroed).
func BenchmarkReadRange(b *testing.B) {
	req := []byte(strings.ReplaceAll(strings.ReplaceAll(string(rangeRequest(5000)), ", ", ","), ": ", ":"))
	b.SetBytes(int64(len(req)))
	buf := make([]byte, 0, readRoom)
	for b.Loop() {
		s := &scanner{b: buf, source: source{src: bytes.NewReader(req)}}
		if _, ms, ok := decodeFrom(s); !ok || ms.Len() != 5000 {
			b.Fatal("not read")
		}
	}
}
