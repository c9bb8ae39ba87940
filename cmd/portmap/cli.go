package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/portmap-dev/portmap/pkg/buildinfo"
)

// command is one subcommand of the person-facing command line.
type command struct {
	name    string
	summary string
	run     func(args []string) int
}

// commands are the subcommands, in the order help lists them; help
// itself is added in init (it lists them).
var commands []command

func init() {
	commands = []command{
		{"sync", "bring the host ports to what libcni's cache holds; --watch: the node agent", syncMain},
		{"list", "this host's host-port table, every backend and layer", listMain},
		{"install", "copy this binary into a CNI plugin directory, atomically", installMain},
		{"version", "which build this is: version, VCS revision, Go and CNI versions", versionMain},
		{"help", "this text, or a command's usage: portmap help COMMAND", helpMain},
	}
}

// cli runs the command line of a person (no CNI_COMMAND) and returns the
// exit status: 0 done, 1 failed, 2 bad usage.
func cli(args []string) int {
	switch args[0] {
	case "-h", "-help", "--help":
		return helpMain(nil)
	case "-version", "--version":
		return versionMain(nil)
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:])
		}
	}
	fmt.Fprintf(os.Stderr, "portmap: unknown command %q\n\n", args[0])
	usage(os.Stderr)
	return 2
}

// usage is the top-level help text.
func usage(w io.Writer) {
	fmt.Fprintf(w, `portmap: the CNI plugin that forwards host ports to containers.

As a CNI plugin a runtime runs it (CNI_COMMAND=ADD, DEL, CHECK, GC, STATUS,
VERSION; the network configuration on stdin): put {"type": "portmap",
"capabilities": {"portMappings": true}} in a conflist after the plugin that
gives the container its address. Run by a person it has these commands:

`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s  %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nportmap COMMAND --help shows a command's flags. %s.\n", buildinfo.Get())
}

func helpMain(args []string) int {
	if len(args) == 0 {
		usage(os.Stdout)
		return 0
	}
	if len(args) == 1 && args[0] != "help" {
		for _, c := range commands {
			if c.name == args[0] {
				return c.run([]string{"--help"})
			}
		}
	}
	fmt.Fprintf(os.Stderr, "portmap help: unknown command %q\n\n", strings.Join(args, " "))
	usage(os.Stderr)
	return 2
}

func versionMain(args []string) int {
	fs := newFlags("version", "", "print which build this is")
	asJSON := fs.Bool("json", false, "print it as JSON")
	if code, done := parse(fs, args); done {
		return code
	}
	in := buildinfo.Get()
	if *asJSON {
		return printJSON(os.Stdout, in)
	}
	fmt.Print(in.Long())
	return 0
}

// newFlags is the flag set of `portmap name`: its usage is the synopsis
// (after "portmap name"), the description and the flags.
func newFlags(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet("portmap "+name, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: portmap %s", name)
		if synopsis != "" {
			fmt.Fprintf(w, " %s", synopsis)
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
func parse(fs *flag.FlagSet, args []string) (code int, done bool) {
	var out bytes.Buffer
	fs.SetOutput(&out)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		os.Stdout.Write(out.Bytes())
		return 0, true
	}
	if err == nil && fs.NArg() > 0 {
		fmt.Fprintf(&out, "unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		err = errors.New("usage")
	}
	fs.SetOutput(os.Stderr)
	if err != nil {
		os.Stderr.Write(out.Bytes())
		return 2, true
	}
	return 0, false
}
