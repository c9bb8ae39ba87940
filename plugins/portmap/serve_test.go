package portmap

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

// TestPreparse: a request that decodes reaches skel as its cniVersion and
// name alone, and the verb gets the configuration decoded once (once:
// a second call decodes what it is given); one that does not reaches
// skel as it came, and the verb decodes it itself (so errors are as
// before).
func TestPreparse(t *testing.T) {
	good := conf(t, withMappings(nil))
	for _, tt := range []struct {
		name    string
		stdin   []byte
		decoded bool
	}{
		{"decodes", good, true},
		{"no cniVersion", bytes.Replace(good, []byte(`"cniVersion":"1.0.0",`), nil, 1), true},
		{"not JSON", []byte(`{"name":`), false},
		{"a bad value", bytes.Replace(good, []byte(`"hostPort":8080`), []byte(`"hostPort":0`), 1), false},
		{"a bad name", bytes.Replace(good, []byte(`"name":"`), []byte(`"name":"-`), 1), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name != "decodes" && bytes.Equal(tt.stdin, good) {
				t.Fatalf("the case is the good request: %s", good)
			}
			p, _, _ := newFake()
			f := p.preparse(bytes.NewReader(tt.stdin), "eth0")
			got, err := io.ReadAll(f)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.decoded {
				if !bytes.Equal(got, tt.stdin) {
					t.Fatalf("skel reads %q, want the request as it came", got)
				}
				if c := p.decodedFor(got); c != nil {
					t.Fatalf("decodedFor a request that did not decode: %+v", c)
				}
				return
			}
			var brief map[string]any
			if err := json.Unmarshal(got, &brief); err != nil {
				t.Fatalf("skel reads %q: %v", got, err)
			}
			var full map[string]any
			_ = json.Unmarshal(tt.stdin, &full)
			if len(brief) > 2 || brief["name"] != full["name"] || brief["cniVersion"] != full["cniVersion"] {
				t.Fatalf("skel reads %s, want only the request's cniVersion (%v) and name (%v)", got, full["cniVersion"], full["name"])
			}
			c := p.decodedFor(got)
			if c == nil || c.Request.Mappings.Len() != 2 || c.Network != full["name"] {
				t.Fatalf("decodedFor the brief: %+v, want the request's configuration", c)
			}
			if c := p.decodedFor(got); c != nil {
				t.Fatal("decodedFor answered twice")
			}
		})
	}
}
