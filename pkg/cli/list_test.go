package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
	"github.com/portmap-dev/portmap/test/fixture"
)

func TestWriteTableGolden(t *testing.T) {
	entries := []inventory.Entry{
		{HostIP: "*", HostPort: 8080, Protocol: "tcp", ContainerIP: "192.0.2.2", ContainerPort: 80, Network: "net1", ContainerID: "c1", Backend: "iptables"},
		{HostIP: "198.51.100.1", HostPort: 8053, Protocol: "udp", ContainerIP: "2001:db8::2", ContainerPort: 53, Network: "a-longer-network", ContainerID: "0123456789abcdef", Backend: "nftables"},
	}
	rows := make([]listed, len(entries))
	for i, e := range entries {
		rows[i].Entry = e
	}
	var b bytes.Buffer
	if err := writeTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	fixture.Golden(t, "testdata/list.golden", b.String())
	rows[0].DroppedBy = strictNote
	b.Reset()
	if err := writeTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	fixture.Golden(t, "testdata/list-dropped.golden", b.String())
}

// TestListUnderStrictForwardPorts: where firewalld's StrictForwardPorts
// is on, the entries of the DNAT backends are marked dropped, in JSON
// and in the table, with a note why; not the socket path's; where it is
// off, nothing is; where firewalld does not answer, list says so.
func TestListUnderStrictForwardPorts(t *testing.T) {
	for _, c := range []struct {
		name           string
		strict         bool
		err            error
		dropped, notes bool
	}{
		{"on", true, nil, true, true},
		{"off", false, nil, false, false},
		{"no answer", false, errors.New("ask firewalld for StrictForwardPorts: ?: timeout"), false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, fh := fakehost.New()
			in := plan.Installed{HostPort: 8080, Protocol: plan.TCP, ContainerIP: net.ParseIP("192.0.2.2").To4(), ContainerPort: 80,
				Owner: plan.Owner{Network: "net1", ContainerID: "c1"}}
			fh.Installed = map[string][]plan.Installed{"iptables ipv4": {in}, "localhost ipv4": {in}}
			h.StrictForwardPorts = func() (bool, string, error) { return c.strict, "", c.err }
			var js, table, notes bytes.Buffer
			err := list(&js, &notes, h, true, nil)
			if (err != nil) != (c.err != nil) {
				t.Errorf("list: %v, want %v", err, c.err)
			}
			var got []listed
			if err := json.Unmarshal(js.Bytes(), &got); err != nil || len(got) != 2 {
				t.Fatalf("list --json: %v %s", err, js.String())
			}
			for _, e := range got {
				want := ""
				if c.dropped && e.Backend == "iptables" {
					want = strictNote
				}
				if e.DroppedBy != want {
					t.Errorf("%s entry dropped by %q, want %q", e.Backend, e.DroppedBy, want)
				}
			}
			notes.Reset()
			_ = list(&table, &notes, h, false, nil)
			if strings.Contains(table.String(), "DROPPED BY") != c.dropped || strings.Contains(notes.String(), "StrictForwardPorts is on") != c.notes {
				t.Errorf("table:\n%s\nnotes: %s", table.String(), notes.String())
			}
		})
	}
}

// list in process: every backend's and layer's mappings of both
// families, as a table or JSON; a backend that cannot be read is exit 1
// after what could be read.
func TestListCommand(t *testing.T) {
	installed := plan.Installed{HostPort: 8080, Protocol: plan.TCP, ContainerIP: net.ParseIP("192.0.2.2").To4(), ContainerPort: 80,
		Owner: plan.Owner{Network: "net1", ContainerID: "c1"}}
	for _, tt := range []struct {
		args []string
		fail error
		code int
		out  string
	}{
		{args: nil, out: "*        8080       tcp    192.0.2.2     80              net1     c1            nftables"},
		{args: []string{"--json"}, out: `"containerID": "c1"`},
		{args: []string{"--bpf-pin-dir", "/run/pins"}, out: "HOST IP"},
		{args: []string{"--bpf-pin-dir", "pins"}, code: 2},
		{args: nil, fail: errors.New("netlink: permission denied"), code: 1, out: "HOST IP"},
	} {
		p, fh, out, errb := fakeProgram()
		fh.Installed = map[string][]plan.Installed{"nftables ipv4": {installed}}
		fh.FailAll = tt.fail
		code := p.Run(append([]string{"list"}, tt.args...))
		if code != tt.code || !strings.Contains(out.String(), tt.out) || (code == 0) != (errb.Len() == 0) {
			t.Errorf("list %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s\nwant %q", tt.args, code, tt.code, out, errb, tt.out)
		}
	}
}
