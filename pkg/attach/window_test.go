package attach

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// chunks reads b in pieces of the sizes given, in turn.
type chunks struct {
	b     []byte
	sizes []int
	k     int
}

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.b), c.sizes[c.k%len(c.sizes)])
	c.k++
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

// readers are the ways a request comes: whole, a byte at a time, in
// pieces that cut entries anywhere, as a pipe gives it (a window).
func readers(b []byte) map[string]io.Reader {
	return map[string]io.Reader{
		"whole":    bytes.NewReader(b),
		"one byte": iotest.OneByteReader(bytes.NewReader(b)),
		"pieces":   &chunks{b: b, sizes: []int{7, 1, 61, 3, 4093}},
		"data+EOF": iotest.DataErrReader(bytes.NewReader(b)),
	}
}

// diffRead checks that a request read from a source decodes as it does
// in memory, and that the request as it came is spelled again whole.
func diffRead(t *testing.T, b []byte) {
	t.Helper()
	wnc, wms, wok := decodeFast(b)
	for name, r := range readers(b) {
		s := &scanner{b: make([]byte, 0, 64), source: source{src: r}}
		nc, ms, ok := decodeFrom(s)
		if ok != wok || (ok && (!reflect.DeepEqual(nc, wnc) || !reflect.DeepEqual(ms.Slice(), wms.Slice()))) {
			t.Fatalf("%s, read %s: %v %+v %v; in memory %v %+v %v", b, name, ok, nc, ms.Slice(), wok, wnc, wms.Slice())
		}
		if got := s.whole(); !bytes.Equal(got, b) {
			t.Fatalf("read %s, spelled again:\n%s\nwant\n%s", name, got, b)
		}
	}
}

// rangeOf is a request of n entries from host port from on, as
// encoding/json writes them (sep ","), or with other white space.
func rangeOf(from, n int, sep, tail string) []byte {
	var es []string
	for i := range n {
		es = append(es, fmt.Sprintf(`{"hostPort":%d,"containerPort":%d,"protocol":"tcp"}`, from+i, from+i))
	}
	return []byte(`{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"portMappings":[` + strings.Join(es, sep) + `]},"type":"portmap"` + tail)
}

// TestReadWindow: every request decodes from a source as in memory, and
// comes back whole, however it is cut; a range spelled as
// encoding/json spells it is let go of as it is read, and one spelled
// otherwise is read all the same.
func TestReadWindow(t *testing.T) {
	var cases [][]byte
	for _, r := range requests {
		cases = append(cases, []byte(r))
	}
	for _, c := range append(shapeCases, mappingsJSONCases...) {
		cases = append(cases, []byte(`{"name":"n","runtimeConfig":{"portMappings":`+c+`},"type":"x"}`))
	}
	for _, r := range [][3]int{{1, 300}, {9990, 20}, {65500, 36}} {
		for _, sep := range []string{",", ", ", ",\n"} {
			for _, tail := range []string{"}", "} ", "", "}x", `,"a":1}`} {
				cases = append(cases, rangeOf(r[0], r[1], sep, tail))
			}
		}
	}
	for _, c := range cases {
		diffRead(t, c)
	}

	t.Run("a range is let go of", func(t *testing.T) {
		req := rangeOf(20000, 5000, ",", "}")
		s := &scanner{b: make([]byte, 0, readRoom), source: source{src: bytes.NewReader(req)}}
		_, ms, ok := decodeFrom(s)
		if !ok || ms.Len() != 5000 {
			t.Fatalf("read %v, %d mappings; want 5000", ok, ms.Len())
		}
		if len(s.b) > 2*window || cap(s.b) != readRoom {
			t.Errorf("%d bytes of the %d-byte request held (capacity %d); want at most %d", len(s.b), len(req), cap(s.b), 2*window)
		}
		if len(s.elided) == 0 {
			t.Error("nothing let go")
		}
		if !bytes.Equal(s.whole(), req) {
			t.Error("not spelled again as it came")
		}
	})
}

// TestRead: Read gives Parse's configuration, or Parse's error and the
// request as it came, and the error of a source that fails.
func TestRead(t *testing.T) {
	good := rangeOf(20000, 3000, ",", "")
	good = append(good[:len(good)-len(`,"type":"portmap"`)], `,"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"10.0.0.2/16","interface":0}]},"type":"portmap"}`...)
	bad := bytes.Replace(good, []byte(`"hostPort":21000,`), []byte(`"hostPort":0,`), 1)
	for _, tt := range []struct {
		name string
		req  []byte
	}{{"good", good}, {"a bad value late in a range", bad}, {"cut short", good[:len(good)/2]}} {
		t.Run(tt.name, func(t *testing.T) {
			want, werr := Parse(tt.req, "eth0", "iptables")
			for name, r := range readers(tt.req) {
				c, sent, err := Read(r, "eth0", "iptables")
				if !reflect.DeepEqual(err, werr) {
					t.Fatalf("read %s: error %v; Parse's %v", name, err, werr)
				}
				if err != nil {
					if !bytes.Equal(sent, tt.req) {
						t.Fatalf("read %s: %d bytes given back; want the %d sent", name, len(sent), len(tt.req))
					}
					continue
				}
				if sent != nil || !reflect.DeepEqual(c.Request.Mappings.Slice(), want.Request.Mappings.Slice()) || c.Network != want.Network || c.ContainerNets[4].String() != want.ContainerNets[4].String() {
					t.Fatalf("read %s: %+v; Parse's %+v", name, c, want)
				}
			}
		})
	}
	t.Run("a source that fails", func(t *testing.T) {
		broken := errors.New("broken")
		r := io.MultiReader(bytes.NewReader(good[:100000]), iotest.ErrReader(broken))
		_, sent, err := Read(r, "eth0", "iptables")
		if !errors.Is(err, broken) || !bytes.Equal(sent, good[:100000]) {
			t.Fatalf("%v, %d bytes given back; want %v and the 100000 read", err, len(sent), broken)
		}
	})
}
