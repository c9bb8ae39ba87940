package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// bin builds the plugin and the agent once per test binary, with the VCS
// information the toolchain records (the environment may say
// -buildvcs=false), and returns the path of name.
func bin(t *testing.T, name string) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "portmap-cli-")
		if binErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", binDir+"/", ".", "../portmap-agent").CombinedOutput()
		if err != nil {
			binErr = errors.New(string(out))
		}
	})
	if binErr != nil {
		t.Fatalf("go build: %v", binErr)
	}
	return filepath.Join(binDir, name)
}

// run runs the plugin binary as a person would: no CNI_COMMAND.
func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runBin(t, "portmap", nil, args...)
}

// runBin runs binary name with env and args.
func runBin(t *testing.T, name string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin(t, name), args...)
	if emu := os.Getenv("PORTMAP_QEMU_USER"); emu != "" {
		// make cross-test: the binary is another architecture's
		cmd = exec.Command(emu, append([]string{bin(t, name)}, args...)...)
	}
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// flagsOf are, for each binary, the flags each of its subcommands must
// name in its --help.
var flagsOf = map[string]map[string][]string{
	"portmap": {
		"install": {"-dest", "-name"},
		"version": {"-json"},
	},
	"portmap-agent": {
		"sync":    {"-cache-dir", "-network", "-prune", "-bpf-pin-dir", "-dry-run", "-json", "-watch", "-interval", "-debounce", "-root", "-metrics-addr", "-log-format"},
		"list":    {"-json", "-bpf-pin-dir"},
		"version": {"-json"},
	},
}

func TestCLIHelp(t *testing.T) {
	for bin, commands := range flagsOf {
		for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
			out, errOut, code := runBin(t, bin, nil, args...)
			if code != 0 || errOut != "" {
				t.Errorf("%s %s: exit %d, stderr %q; want 0 and nothing", bin, args[0], code, errOut)
			}
			for name := range commands {
				if !strings.Contains(out, "\n  "+name+" ") {
					t.Errorf("%s %s does not list %q:\n%s", bin, args[0], name, out)
				}
			}
			if bin == "portmap" && (!strings.Contains(out, "CNI_COMMAND") || !strings.Contains(out, "portmap-agent")) {
				t.Errorf("portmap %s does not point at the CNI usage and the agent:\n%s", args[0], out)
			}
		}
		for name, flags := range commands {
			for _, args := range [][]string{{name, "--help"}, {name, "-h"}, {"help", name}} {
				out, errOut, code := runBin(t, bin, nil, args...)
				if code != 0 || errOut != "" {
					t.Errorf("%s %s: exit %d, stderr %q; want 0 and nothing", bin, strings.Join(args, " "), code, errOut)
				}
				if !strings.HasPrefix(out, "usage: "+bin+" "+name) {
					t.Errorf("%s %s: %q, want its usage", bin, strings.Join(args, " "), out)
				}
				for _, f := range flags {
					if !strings.Contains(out, "  "+f+" ") && !strings.Contains(out, "  "+f+"\n") {
						t.Errorf("%s %s does not name %s:\n%s", bin, strings.Join(args, " "), f, out)
					}
				}
			}
		}
	}
}

func TestCLIBadUsage(t *testing.T) {
	for _, c := range []struct {
		bin  string
		args []string
		want string // in stderr, beside the usage
	}{
		{"portmap", []string{"bogus"}, `unknown command "bogus"`},
		{"portmap", []string{"--bogus"}, `unknown command "--bogus"`},
		{"portmap", []string{"help", "bogus"}, `unknown command "bogus"`},
		{"portmap", []string{"list"}, "portmap: list is a command of portmap-agent"},
		{"portmap", []string{"sync", "--prune"}, "portmap: sync is a command of portmap-agent"},
		{"portmap", []string{"install", "--dest"}, "flag needs an argument: -dest"},
		{"portmap", []string{"version", "extra"}, `unexpected argument "extra"`},
		{"portmap-agent", []string{"install"}, `unknown command "install"`},
		{"portmap-agent", []string{"sync", "--bogus"}, "flag provided but not defined: -bogus"},
		{"portmap-agent", []string{"sync", "extra"}, `unexpected argument "extra"`},
		{"portmap-agent", []string{"list", "--yaml"}, "flag provided but not defined: -yaml"},
		{"portmap-agent", []string{"list", "--bpf-pin-dir"}, "flag needs an argument: -bpf-pin-dir"},
		{"portmap-agent", []string{"list", "--bpf-pin-dir", "pins"}, `--bpf-pin-dir "pins": want a clean absolute path`},
		{"portmap-agent", []string{"sync", "--metrics-addr", "127.0.0.1:0"}, "--metrics-addr only with --watch"},
		{"portmap-agent", []string{"sync", "--watch", "--log-format", "xml"}, `--log-format "xml": want text or json`},
	} {
		out, errOut, code := runBin(t, c.bin, nil, c.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("%s %s: exit %d, stdout %q, stderr %q; want 2, nothing, %q and the usage",
				c.bin, strings.Join(c.args, " "), code, out, errOut, c.want)
		}
	}
}

// TestCLIVersion: the build info of a binary built from git names its
// revision; the CNI VERSION verb's about text names the same version.
func TestCLIVersion(t *testing.T) {
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI runs in a git clone: git rev-parse HEAD: %v", err)
		}
		t.Skip("not built from a git checkout: no revision to find")
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, _, code := run(t, args...)
		if code != 0 || !strings.Contains(out, "revision:     "+strings.TrimSpace(string(rev))) ||
			!strings.Contains(out, "CNI versions: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0") || !strings.Contains(out, "go:           go1.") {
			t.Errorf("portmap %s: exit %d:\n%s\nwant revision %s, the Go and CNI versions", args[0], code, out, rev)
		}
	}
	out, _, _ := run(t, "version", "--json")
	var in struct{ Version, Revision string }
	if err := json.Unmarshal([]byte(out), &in); err != nil || in.Revision != strings.TrimSpace(string(rev)) || in.Version == "" {
		t.Errorf("portmap version --json: %q (%v)", out, err)
	}
	// Without arguments and CNI_COMMAND: skel's about text, exit 0, as
	// upstream's plugins.
	_, about, code := run(t)
	if code != 0 || !strings.HasPrefix(about, "CNI portmap plugin "+in.Version) {
		t.Errorf("portmap: exit %d, %q; want the about text naming %s", code, about, in.Version)
	}
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// TestAgentCLI: portmap-agent has sync and list, no install, and serves
// metrics; it refuses to be run as a CNI plugin.
func TestAgentCLI(t *testing.T) {
	out, errOut, code := runBin(t, "portmap-agent", nil, "help")
	if code != 0 || errOut != "" || !strings.Contains(out, "not a CNI plugin") || strings.Contains(out, "\n  install ") {
		t.Errorf("portmap-agent help: exit %d, %q %q", code, out, errOut)
	}
	for _, c := range []string{"sync", "list", "version"} {
		if !strings.Contains(out, "\n  "+c+" ") {
			t.Errorf("portmap-agent help does not list %s:\n%s", c, out)
		}
	}
	out, _, code = runBin(t, "portmap-agent", nil, "sync", "--help")
	if code != 0 || !strings.HasPrefix(out, "usage: portmap-agent sync") || !strings.Contains(out, "-metrics-addr") {
		t.Errorf("portmap-agent sync --help: exit %d:\n%s", code, out)
	}
	if _, errOut, code := runBin(t, "portmap-agent", nil, "install"); code != 2 || !strings.Contains(errOut, `unknown command "install"`) {
		t.Errorf("portmap-agent install: exit %d, %q; want 2", code, errOut)
	}
	if _, errOut, code := runBin(t, "portmap-agent", []string{"CNI_COMMAND=ADD"}); code != 1 || !strings.Contains(errOut, "not a CNI plugin") {
		t.Errorf("portmap-agent as a plugin: exit %d, %q; want 1", code, errOut)
	}
	if _, errOut, code := runBin(t, "portmap-agent", nil); code != 2 || !strings.Contains(errOut, "usage") && !strings.Contains(errOut, "commands") {
		t.Errorf("portmap-agent without arguments: exit %d, %q; want 2 and the usage", code, errOut)
	}
	out, _, _ = runBin(t, "portmap-agent", nil, "version")
	plugin, _, _ := run(t, "version")
	if out == "" || out != plugin {
		t.Errorf("portmap-agent version %q, portmap version %q: want the same build", out, plugin)
	}
}

// TestLinks: the plugin binary links no HTTP server (the agent's
// metrics are portmap-agent's), and neither binary links a package of
// test/ (the fake host, fixtures). The in-memory kernels and tracers
// live in _test.go files, which no binary can link.
func TestLinks(t *testing.T) {
	for _, dir := range []string{".", "../portmap-agent"} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", dir).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 50 {
			t.Fatalf("go list -deps gave %d packages: %q", len(deps), deps)
		}
		for _, p := range deps {
			if strings.HasPrefix(p, "github.com/portmap-dev/portmap/test/") {
				t.Errorf("%s links %s", dir, p)
			}
			if dir == "." && p == "net/http" {
				t.Errorf("the plugin links %s", p)
			}
		}
	}
}
