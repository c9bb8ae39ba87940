// Package cmdline is the command line a person uses (no CNI_COMMAND) of
// both binaries: a program of named commands with version and help, each
// command's flags and usage, and the exit statuses (0 done, 1 failed, 2
// bad usage). The plugin, portmap, has install; the node agent,
// portmap-agent, has sync and list (pkg/cli): the plugin, run for every
// CNI verb, carries only what its verbs need.
package cmdline

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/portmap-dev/portmap/pkg/buildinfo"
)

// Program is one binary's command line.
type Program struct {
	// Name is the binary's name in usage texts.
	Name string
	// Intro starts the usage text: what the binary is.
	Intro string
	// Commands are the program's own commands, in the order help lists
	// them; version and help follow.
	Commands []Command
	// Elsewhere names, for a command another binary has, that binary.
	Elsewhere map[string]string
	// Stdout and Stderr are the process's unless set (tests).
	Stdout, Stderr io.Writer
}

// Command is one subcommand: run gets the program and the arguments
// after the command's name, and returns the exit status.
type Command struct {
	Name    string
	Summary string
	Run     func(p Program, args []string) int
}

// all are the program's commands, version and help included.
func (p Program) all() []Command {
	return append(append([]Command(nil), p.Commands...),
		Command{"version", "which build this is: version, VCS revision, Go and CNI versions", Program.versionMain},
		Command{"help", "this text, or a command's usage: " + p.Name + " help COMMAND", Program.helpMain})
}

// Run runs the command line args (without the program name) and returns
// the exit status: 0 done, 1 failed, 2 bad usage.
func (p Program) Run(args []string) int {
	if p.Stdout == nil {
		p.Stdout = os.Stdout
	}
	if p.Stderr == nil {
		p.Stderr = os.Stderr
	}
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
	for _, c := range p.all() {
		if c.Name == args[0] {
			return c.Run(p, args[1:])
		}
	}
	if bin, ok := p.Elsewhere[args[0]]; ok {
		fmt.Fprintf(p.Stderr, "%s: %s is a command of %s\n", p.Name, args[0], bin)
		return 2
	}
	fmt.Fprintf(p.Stderr, "%s: unknown command %q\n\n", p.Name, args[0])
	p.usage(p.Stderr)
	return 2
}

// usage is the top-level help text.
func (p Program) usage(w io.Writer) {
	fmt.Fprintf(w, "%s: %s\n\n", p.Name, p.Intro)
	for _, c := range p.all() {
		fmt.Fprintf(w, "  %-8s  %s\n", c.Name, c.Summary)
	}
	fmt.Fprintf(w, "\n%s COMMAND --help shows a command's flags. %s.\n", p.Name, buildinfo.Get())
}

func (p Program) helpMain(args []string) int {
	if len(args) == 0 {
		p.usage(p.Stdout)
		return 0
	}
	if len(args) == 1 && args[0] != "help" {
		for _, c := range p.all() {
			if c.Name == args[0] {
				return c.Run(p, []string{"--help"})
			}
		}
	}
	fmt.Fprintf(p.Stderr, "%s help: unknown command %q\n\n", p.Name, strings.Join(args, " "))
	p.usage(p.Stderr)
	return 2
}

func (p Program) versionMain(args []string) int {
	fs := p.Flags("version", "", "Print which build this is.")
	asJSON := fs.Bool("json", false, "print it as JSON")
	if code, done := p.Parse(fs, args); done {
		return code
	}
	in := buildinfo.Get()
	if *asJSON {
		return PrintJSON(p.Stdout, in)
	}
	fmt.Fprint(p.Stdout, in.Long())
	return 0
}

// Flags is the flag set of `<program> name`: its usage is the synopsis
// (after the command's name), the description and the flags.
func (p Program) Flags(name, synopsis, description string) *flag.FlagSet {
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

// Parse parses args into fs. done is true when the command must stop
// with code: 0 after --help (the usage on stdout), 2 after a bad flag or
// argument (the error and the usage on stderr). A command without
// positional arguments rejects any.
func (p Program) Parse(fs *flag.FlagSet, args []string) (code int, done bool) {
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

// PrintJSON writes v indented and returns the exit status.
func PrintJSON(w io.Writer, v any) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return 1
	}
	return 0
}
