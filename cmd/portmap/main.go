// Command portmap is the CNI chained plugin that forwards host ports to
// containers, a drop-in replacement for the upstream portmap plugin. Run
// by a runtime (CNI_COMMAND set) it serves the CNI verbs through skel;
// run by a person it has a few commands of its own (pkg/cmdline):
//
//	portmap install --dest DIR   copy this binary into a CNI bin directory, atomically
//	portmap version              which build this is
//	portmap help [COMMAND]       the commands, or one command's flags
//
// The node's host-port table (list) and the repair of what a firewall
// flushed (sync) are the node agent's, portmap-agent: the plugin, run for
// every CNI verb, carries only what the verbs run.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/version"

	"github.com/portmap-dev/portmap/pkg/buildinfo"
	"github.com/portmap-dev/portmap/pkg/cmdline"
	"github.com/portmap-dev/portmap/pkg/stdinpipe"
	"github.com/portmap-dev/portmap/plugins/portmap"
)

// intro starts the usage text.
const intro = `the CNI plugin that forwards host ports to containers.

As a CNI plugin a runtime runs it (CNI_COMMAND=ADD, DEL, CHECK, GC, STATUS,
VERSION; the network configuration on stdin): put {"type": "portmap",
"capabilities": {"portMappings": true}} in a conflist after the plugin that
gives the container its address. Its node agent, portmap-agent, lists the
host ports (list) and repairs them (sync). Run by a person it has these
commands:`

func main() {
	// first: a runtime's writer waiting on a full stdin pipe writes the
	// rest of a large request while the program starts
	stdinpipe.Widen(0)
	// Runtimes run plugins without arguments and with CNI_COMMAND set;
	// without both, skel prints the about text, as upstream's plugins do.
	if len(os.Args) > 1 && os.Getenv("CNI_COMMAND") == "" {
		p := cmdline.Program{Name: "portmap", Intro: intro, Commands: []cmdline.Command{cmdline.Install(os.Executable)},
			Elsewhere: map[string]string{"list": "portmap-agent, the node agent", "sync": "portmap-agent, the node agent"}}
		os.Exit(p.Run(os.Args[1:]))
	}
	portmap.New().Serve(version.PluginSupports(buildinfo.CNIVersions...), buildinfo.Get().String())
}
