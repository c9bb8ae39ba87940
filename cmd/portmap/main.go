// Command portmap is the CNI chained plugin that forwards host ports to
// containers, a drop-in replacement for the upstream portmap plugin. Run
// by a runtime (CNI_COMMAND set) it serves the CNI verbs through skel;
// run by a person it has commands of its own, one file each here:
//
//	portmap list [--json]        this host's host-port table (--bpf-pin-dir: a socket-path site too)
//	portmap sync [flags]         bring the host ports to what libcni's cache holds (the node agent)
//	portmap install --dest DIR   copy this binary into a CNI bin directory, atomically
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
	bv "github.com/containernetworking/plugins/pkg/utils/buildversion"

	"github.com/portmap-dev/portmap/plugins/portmap"
)

// commands are the subcommands; each returns the exit status.
var commands = map[string]func(args []string) int{
	"list":    listMain,
	"sync":    syncMain,
	"install": installMain,
}

func main() {
	if len(os.Args) > 1 && os.Getenv("CNI_COMMAND") == "" {
		if run, ok := commands[os.Args[1]]; ok {
			os.Exit(run(os.Args[2:]))
		}
	}
	skel.PluginMainFuncs(portmap.New().Funcs(), version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), bv.BuildString("portmap"))
}
