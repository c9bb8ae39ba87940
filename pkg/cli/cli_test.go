package cli

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/buildinfo"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/test/fakehost"
)

// fakeCLI is portmap-agent's command line on a fake host, its streams
// in buffers: the commands run in process, as skel's tests run a
// plugin's verbs.
type fakeCLI struct {
	Agent
	out, errb *bytes.Buffer
}

func (f *fakeCLI) Run(args []string) int {
	p := f.Agent.Program()
	p.Stdout, p.Stderr = f.out, f.errb
	return p.Run(args)
}

func fakeProgram() (*fakeCLI, *fakehost.Host, *bytes.Buffer, *bytes.Buffer) {
	h, fh := fakehost.New()
	var out, errb bytes.Buffer
	return &fakeCLI{Agent: Agent{
		Host:   func(io.Writer) *host.Host { return h },
		Chroot: func(string) error { return errors.New("no chroot in a unit test") },
	}, out: &out, errb: &errb}, fh, &out, &errb
}

// The top level: usage and exit codes, help of a command, version.
func TestRun(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		code     int
		out, err string // in stdout, stderr ("" : empty)
	}{
		{args: nil, code: 2, err: "the node agent of the portmap CNI plugin"},
		{args: []string{"bogus"}, code: 2, err: `portmap-agent: unknown command "bogus"`},
		{args: []string{"install"}, code: 2, err: `portmap-agent: unknown command "install"`},
		{args: []string{"help"}, out: "  sync      bring the host ports"},
		{args: []string{"--help"}, out: "  list      this host's host-port table"},
		{args: []string{"help", "sync"}, out: "usage: portmap-agent sync [--cache-dir DIR]"},
		{args: []string{"help", "list"}, out: "usage: portmap-agent list [--json]"},
		{args: []string{"help", "nothing"}, code: 2, err: `portmap-agent help: unknown command "nothing"`},
		{args: []string{"help", "sync", "list"}, code: 2, err: `unknown command "sync list"`},
		{args: []string{"sync", "--help"}, out: "--prune"},
		{args: []string{"version"}, out: buildinfo.Get().Long()},
		{args: []string{"--version"}, out: buildinfo.Get().Long()},
	} {
		p, fh, out, errb := fakeProgram()
		code := p.Run(tt.args)
		if code != tt.code || (tt.out == "") != (out.Len() == 0) || (tt.err == "") != (errb.Len() == 0) ||
			!strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.err) || fh.Calls() != "" {
			t.Errorf("%q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s\ncalls: %q\nwant %q on stdout and %q on stderr, no call",
				tt.args, code, tt.code, out, errb, fh.Calls(), tt.out, tt.err)
		}
	}
}
