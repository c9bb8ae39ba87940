// Command portmap is the CNI chained plugin that forwards host ports to
// containers, a drop-in replacement for the upstream portmap plugin. Run
// by a person (CNI_COMMAND unset) it has commands of its own:
//
//	portmap list [--json]    this host's host-port table
//	portmap sync [flags]     bring the host ports to what libcni's cache holds
//	portmap install --dest DIR   copy this binary into a CNI bin directory, atomically
package main

import (
	"fmt"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
	bv "github.com/containernetworking/plugins/pkg/utils/buildversion"

	"github.com/portmap-dev/portmap/plugins/portmap"
)

func main() {
	if len(os.Args) > 1 && os.Getenv("CNI_COMMAND") == "" {
		switch os.Args[1] {
		case "list":
			if err := portmap.List(os.Stdout, os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "portmap:", err)
				os.Exit(1)
			}
			return
		case "sync":
			os.Exit(portmap.SyncMain(portmap.New(), os.Args[2:]))
		case "install":
			os.Exit(portmap.InstallMain(portmap.New(), os.Args[2:]))
		}
	}
	skel.PluginMainFuncs(portmap.New().Funcs(), version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), bv.BuildString("portmap"))
}
