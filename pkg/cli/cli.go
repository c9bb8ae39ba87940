// Package cli is the command line of a person (no CNI_COMMAND): the
// commands of the plugin binary, portmap (sync, list, install, version,
// help), and of the node agent's, portmap-agent, which adds the metrics
// and health endpoints to `sync --watch`. They are two binaries so that
// the plugin, run for every CNI verb, links no HTTP server: net/http and
// the Prometheus client cost 4–9 ms of start-up per run and double the
// binary.
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/buildinfo"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/nfevents"
)

// Program is one binary's command line.
type Program struct {
	// Name is the binary's name in usage texts.
	Name string
	// Install offers `install` (the plugin binary copies itself).
	Install bool
	// Metrics, when set, makes `sync --watch --metrics-addr` serve
	// metrics and probes through the observer it returns for a watcher
	// passing every interval.
	Metrics func(interval time.Duration) Observer

	// What the commands are given of the process, as skel gives a
	// plugin's verbs their streams and environment: Run fills what is
	// nil with the real one, and tests run the commands in process with
	// their own.
	Stdout, Stderr io.Writer
	// Host opens the node the commands act on (host.Real), after sync's
	// --root chroot.
	Host func(log io.Writer) *host.Host
	// Executable is the binary install copies (os.Executable).
	Executable func() (string, error)
	// Chroot enters sync's --root (syscall.Chroot, then chdir "/").
	Chroot func(dir string) error
	// Events subscribes `sync --watch` to the firewall's changes
	// (nfevents.Subscribe).
	Events func() (*nfevents.Subscription, error)
	// Context ends `sync --watch` when done; SIGTERM and SIGINT end it
	// too (context.Background).
	Context context.Context
}

// real fills what p leaves nil with the process's own.
func (p Program) real() Program {
	if p.Stdout == nil {
		p.Stdout = os.Stdout
	}
	if p.Stderr == nil {
		p.Stderr = os.Stderr
	}
	if p.Host == nil {
		p.Host = host.Real
	}
	if p.Executable == nil {
		p.Executable = os.Executable
	}
	if p.Chroot == nil {
		p.Chroot = chroot
	}
	if p.Events == nil {
		p.Events = nfevents.Subscribe
	}
	if p.Context == nil {
		p.Context = context.Background()
	}
	return p
}

// chroot enters dir as the process's root.
func chroot(dir string) error {
	if err := syscall.Chroot(dir); err != nil {
		return fmt.Errorf("chroot %s: %w", dir, err)
	}
	return os.Chdir("/")
}

// Observer is what the agent binary adds to the watcher: it is told of
// every pass and event and serves /metrics, /healthz and /readyz.
type Observer interface {
	Pass(agent.PassInfo)
	Event()
	Serve(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error)
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(args []string) int
}

// commands are the program's subcommands, in the order help lists them.
func (p Program) commands() []command {
	cs := []command{
		{"sync", "bring the host ports to what libcni's cache holds; --watch: the node agent", p.syncMain},
		{"list", "this host's host-port table, every backend and layer", p.listMain},
	}
	if p.Install {
		cs = append(cs, command{"install", "copy this binary into a CNI plugin directory, atomically", p.installMain})
	}
	return append(cs,
		command{"version", "which build this is: version, VCS revision, Go and CNI versions", p.versionMain},
		command{"help", "this text, or a command's usage: " + p.Name + " help COMMAND", p.helpMain})
}

// Run runs the command line args (without the program name) and returns
// the exit status: 0 done, 1 failed, 2 bad usage.
func (p Program) Run(args []string) int {
	p = p.real()
	if len(args) == 0 {
		p.usage(p.Stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		return p.helpMain(nil)
	case "-version", "--version":
		return p.versionMain(nil)
	}
	for _, c := range p.commands() {
		if c.name == args[0] {
			return c.run(args[1:])
		}
	}
	fmt.Fprintf(p.Stderr, "%s: unknown command %q\n\n", p.Name, args[0])
	p.usage(p.Stderr)
	return 2
}

// usage is the top-level help text.
func (p Program) usage(w io.Writer) {
	if p.Install {
		fmt.Fprintf(w, `%s: the CNI plugin that forwards host ports to containers.

As a CNI plugin a runtime runs it (CNI_COMMAND=ADD, DEL, CHECK, GC, STATUS,
VERSION; the network configuration on stdin): put {"type": "portmap",
"capabilities": {"portMappings": true}} in a conflist after the plugin that
gives the container its address. Run by a person it has these commands:

`, p.Name)
	} else {
		fmt.Fprintf(w, `%s: the node agent of the portmap CNI plugin.

It keeps the plugin's host ports in line with libcni's cache (sync --watch)
and, with --metrics-addr, serves /metrics, /healthz and /readyz.
It is not a CNI plugin: the plugin is portmap. Its commands:

`, p.Name)
	}
	for _, c := range p.commands() {
		fmt.Fprintf(w, "  %-8s  %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\n%s COMMAND --help shows a command's flags. %s.\n", p.Name, buildinfo.Get())
}

func (p Program) helpMain(args []string) int {
	if len(args) == 0 {
		p.usage(p.Stdout)
		return 0
	}
	if len(args) == 1 && args[0] != "help" {
		for _, c := range p.commands() {
			if c.name == args[0] {
				return c.run([]string{"--help"})
			}
		}
	}
	fmt.Fprintf(p.Stderr, "%s help: unknown command %q\n\n", p.Name, strings.Join(args, " "))
	p.usage(p.Stderr)
	return 2
}

func (p Program) versionMain(args []string) int {
	fs := p.newFlags("version", "", "Print which build this is.")
	asJSON := fs.Bool("json", false, "print it as JSON")
	if code, done := p.parse(fs, args); done {
		return code
	}
	in := buildinfo.Get()
	if *asJSON {
		return printJSON(p.Stdout, in)
	}
	fmt.Fprint(p.Stdout, in.Long())
	return 0
}

// newFlags is the flag set of `<program> name`: its usage is the
// synopsis (after the command's name), the description and the flags.
func (p Program) newFlags(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(p.Name+" "+name, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s %s", p.Name, name)
		if synopsis != "" {
			fmt.Fprintf(w, " %s", strings.ReplaceAll(synopsis, "\n", "\n       "+p.Name+" "+name+" "))
		}
		fmt.Fprintf(w, "\n\n%s\n\nflags:\n", description)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args into fs. done is true when the command must stop
// with code: 0 after --help (the usage on stdout), 2 after a bad flag or
// argument (the error and the usage on stderr). A command without
// positional arguments rejects any.
func (p Program) parse(fs *flag.FlagSet, args []string) (code int, done bool) {
	var out bytes.Buffer
	fs.SetOutput(&out)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		p.Stdout.Write(out.Bytes())
		return 0, true
	}
	if err == nil && fs.NArg() > 0 {
		fmt.Fprintf(&out, "unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		err = errors.New("usage")
	}
	fs.SetOutput(p.Stderr)
	if err != nil {
		p.Stderr.Write(out.Bytes())
		return 2, true
	}
	return 0, false
}

// printJSON writes v indented and returns the exit status.
func printJSON(w io.Writer, v any) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return 1
	}
	return 0
}
