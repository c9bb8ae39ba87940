// Command portmap is the CNI chained plugin that forwards host ports to
// containers, a drop-in replacement for the upstream portmap plugin. Run
// by a runtime (CNI_COMMAND set) it serves the CNI verbs through skel;
// run by a person it has commands of its own (pkg/cli):
//
//	portmap list [--json]        this host's host-port table (--bpf-pin-dir: a socket-path site too)
//	portmap sync [flags]         bring the host ports to what libcni's cache holds (--watch: the agent's loop)
//	portmap install --dest DIR   copy this binary into a CNI bin directory, atomically
//	portmap version              which build this is
//	portmap help [COMMAND]       the commands, or one command's flags
//
// It links no HTTP server: the agent with metrics and probes is
// portmap-agent.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/version"

	"github.com/portmap-dev/portmap/pkg/buildinfo"
	"github.com/portmap-dev/portmap/pkg/cli"
	"github.com/portmap-dev/portmap/pkg/stdinpipe"
	"github.com/portmap-dev/portmap/plugins/portmap"
)

func main() {
	// first: a runtime's writer waiting on a full stdin pipe writes the
	// rest of a large request while the program starts
	stdinpipe.Widen(0)
	// Runtimes run plugins without arguments and with CNI_COMMAND set;
	// without both, skel prints the about text, as upstream's plugins do.
	if len(os.Args) > 1 && os.Getenv("CNI_COMMAND") == "" {
		os.Exit(cli.Program{Name: "portmap", Install: true}.Run(os.Args[1:]))
	}
	portmap.New().Serve(version.PluginSupports(buildinfo.CNIVersions...), buildinfo.Get().String())
}
