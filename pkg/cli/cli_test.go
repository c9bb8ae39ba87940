package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/buildinfo"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/test/fakehost"
)

// fakeProgram is the plugin binary's command line on a fake host, its
// streams in buffers: the commands run in process, as skel's tests run
// a plugin's verbs.
func fakeProgram() (Program, *fakehost.Host, *bytes.Buffer, *bytes.Buffer) {
	h, fh := fakehost.New()
	var out, errb bytes.Buffer
	return Program{Name: "portmap", Install: true, Stdout: &out, Stderr: &errb,
		Host:       func(io.Writer) *host.Host { return h },
		Chroot:     func(string) error { return errors.New("no chroot in a unit test") },
		Executable: func() (string, error) { return "", errors.New("no executable in a unit test") },
	}, fh, &out, &errb
}

// The top level: usage and exit codes, help of a command, version.
func TestRun(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		code     int
		out, err string // in stdout, stderr ("" : empty)
	}{
		{args: nil, code: 2, err: "Run by a person it has these commands"},
		{args: []string{"bogus"}, code: 2, err: `portmap: unknown command "bogus"`},
		{args: []string{"help"}, out: "  sync      bring the host ports"},
		{args: []string{"--help"}, out: "  install   copy this binary"},
		{args: []string{"help", "sync"}, out: "usage: portmap sync [--cache-dir DIR]"},
		{args: []string{"help", "list"}, out: "usage: portmap list [--json]"},
		{args: []string{"help", "nothing"}, code: 2, err: `portmap help: unknown command "nothing"`},
		{args: []string{"help", "sync", "list"}, code: 2, err: `unknown command "sync list"`},
		{args: []string{"sync", "--help"}, out: "--prune"},
		{args: []string{"version"}, out: buildinfo.Get().Long()},
		{args: []string{"--version"}, out: buildinfo.Get().Long()},
		{args: []string{"version", "extra"}, code: 2, err: `unexpected argument "extra"`},
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

// The agent's binary has no install, and says what it is.
func TestAgentProgram(t *testing.T) {
	p, _, out, errb := fakeProgram()
	p.Name, p.Install = "portmap-agent", false
	if code := p.Run([]string{"install"}); code != 2 || !strings.Contains(errb.String(), `unknown command "install"`) {
		t.Errorf("install: exit %d, stderr %s", code, errb)
	}
	if code := p.Run([]string{"help"}); code != 0 || !strings.Contains(out.String(), "the node agent of the portmap CNI plugin") || strings.Contains(out.String(), "install") {
		t.Errorf("help: exit %d, stdout %s", code, out)
	}
}

func TestVersionJSON(t *testing.T) {
	p, _, out, _ := fakeProgram()
	if code := p.Run([]string{"version", "--json"}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var in buildinfo.Info
	if err := json.Unmarshal(out.Bytes(), &in); err != nil || in.Go == "" || len(in.CNI) == 0 {
		t.Errorf("version --json: %v, %+v from %s", err, in, out)
	}
}

// install copies the running binary atomically and says where; a
// destination it cannot write is exit 1 with the reason.
func TestInstall(t *testing.T) {
	self := filepath.Join(t.TempDir(), "portmap")
	if err := os.WriteFile(self, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "bin")
	p, _, out, _ := fakeProgram()
	p.Executable = func() (string, error) { return self, nil }
	if code := p.Run([]string{"install", "--dest", dest, "--name", "pm"}); code != 0 || out.String() != "installed "+dest+"/pm\n" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "pm")); err != nil || string(b) != "#!/bin/true\n" {
		t.Errorf("installed file: %q, %v", b, err)
	}
	blocked := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocked, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p, _, _, errb := fakeProgram()
	p.Executable = func() (string, error) { return self, nil }
	if code := p.Run([]string{"install", "--dest", blocked}); code != 1 || !strings.Contains(errb.String(), "portmap install: create "+blocked) {
		t.Errorf("install into a file: exit %d, stderr %q", code, errb)
	}
	p, _, _, errb = fakeProgram()
	if code := p.Run([]string{"install", "--dest", dest}); code != 1 || !strings.Contains(errb.String(), "no executable") {
		t.Errorf("install without an executable: exit %d, stderr %q", code, errb)
	}
}
