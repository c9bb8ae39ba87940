// Command portmap is the CNI chained plugin that forwards host ports to
// containers, a drop-in replacement for the upstream portmap plugin. Run
// by a person as `portmap list [--json]`, it prints this host's host-port
// table.
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
	if len(os.Args) > 1 && os.Args[1] == "list" && os.Getenv("CNI_COMMAND") == "" {
		if err := portmap.List(os.Stdout, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "portmap:", err)
			os.Exit(1)
		}
		return
	}
	skel.PluginMainFuncs(portmap.New().Funcs(), version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), bv.BuildString("portmap"))
}
