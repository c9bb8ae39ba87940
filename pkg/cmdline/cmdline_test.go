package cmdline

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/buildinfo"
)

// plugin is the plugin binary's command line, its streams in buffers and
// its executable self.
func plugin(self string) (Program, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	executable := func() (string, error) { return self, nil }
	if self == "" {
		executable = func() (string, error) { return "", errors.New("no executable in a unit test") }
	}
	return Program{Name: "portmap", Intro: "the plugin. Its commands:", Commands: []Command{Install(executable)},
		Elsewhere: map[string]string{"list": "portmap-agent"}, Stdout: &out, Stderr: &errb}, &out, &errb
}

// The top level: usage and exit codes, help of a command, version, a
// command of the other binary named.
func TestRun(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		code     int
		out, err string // in stdout, stderr ("" : empty)
	}{
		{args: nil, code: 2, err: "portmap: the plugin. Its commands:"},
		{args: []string{"bogus"}, code: 2, err: `portmap: unknown command "bogus"`},
		{args: []string{"list"}, code: 2, err: "portmap: list is a command of portmap-agent"},
		{args: []string{"help"}, out: "  install   copy this binary"},
		{args: []string{"--help"}, out: "  version   which build this is"},
		{args: []string{"help", "install"}, out: "usage: portmap install [--dest DIR]"},
		{args: []string{"help", "nothing"}, code: 2, err: `portmap help: unknown command "nothing"`},
		{args: []string{"install", "--bogus"}, code: 2, err: "flag provided but not defined: -bogus"},
		{args: []string{"version"}, out: buildinfo.Get().Long()},
		{args: []string{"--version"}, out: buildinfo.Get().Long()},
		{args: []string{"version", "extra"}, code: 2, err: `unexpected argument "extra"`},
	} {
		p, out, errb := plugin("")
		code := p.Run(tt.args)
		if code != tt.code || (tt.out == "") != (out.Len() == 0) || (tt.err == "") != (errb.Len() == 0) ||
			!strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.err) {
			t.Errorf("%q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s\nwant %q on stdout and %q on stderr",
				tt.args, code, tt.code, out, errb, tt.out, tt.err)
		}
	}
}

func TestVersionJSON(t *testing.T) {
	p, out, _ := plugin("")
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
	p, out, _ := plugin(self)
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
	p, _, errb := plugin(self)
	if code := p.Run([]string{"install", "--dest", blocked}); code != 1 || !strings.Contains(errb.String(), "portmap install: create "+blocked) {
		t.Errorf("install into a file: exit %d, stderr %q", code, errb)
	}
	p, _, errb = plugin("")
	if code := p.Run([]string{"install", "--dest", dest}); code != 1 || !strings.Contains(errb.String(), "no executable") {
		t.Errorf("install without an executable: exit %d, stderr %q", code, errb)
	}
}
