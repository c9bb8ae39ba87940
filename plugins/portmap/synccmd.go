package portmap

import (
	"flag"
	"fmt"
	"strings"

	"github.com/portmap-dev/portmap/pkg/cnicache"
)

// networks is the repeatable --network flag.
type networks []string

func (n *networks) String() string     { return strings.Join(*n, ",") }
func (n *networks) Set(v string) error { *n = append(*n, v); return nil }

// SyncMain is `portmap sync`: it parses args, runs one pass and prints its
// report to p.Stdout. It returns the exit status: 0 when everything is
// right or was repaired, 1 when anything could not be, 2 for bad usage.
func SyncMain(p *Plugin, args []string) int {
	fs := flag.NewFlagSet("portmap sync", flag.ContinueOnError)
	fs.SetOutput(p.Stderr)
	var o SyncOptions
	var nets networks
	fs.StringVar(&o.CacheDir, "cache-dir", cnicache.DefaultDir, "libcni's cache directory (its results/ lists the attachments)")
	fs.Var(&nets, "network", "sync only this network (repeatable)")
	fs.BoolVar(&o.Prune, "prune", false, "remove host-port mappings whose owner has no cache entry")
	fs.BoolVar(&o.DryRun, "dry-run", false, "change nothing; report what a pass would do")
	fs.BoolVar(&o.JSON, "json", false, "print the report as JSON")
	fs.Usage = func() {
		fmt.Fprintln(p.Stderr, "usage: portmap sync [--cache-dir DIR] [--network NAME]... [--prune] [--dry-run] [--json]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(p.Stderr, "portmap sync: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	o.Networks = nets
	rep, err := p.Sync(o)
	if rep != nil {
		if werr := WriteSync(p.Stdout, rep, o.JSON); werr != nil {
			fmt.Fprintln(p.Stderr, "portmap sync:", werr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintln(p.Stderr, "portmap sync:", err)
		return 1
	}
	if rep.Failed() {
		return 1
	}
	return 0
}
