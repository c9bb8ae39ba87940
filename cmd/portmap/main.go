// Command portmap is the CNI chained plugin that forwards host ports to
// containers, a drop-in replacement for the upstream portmap plugin.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
	bv "github.com/containernetworking/plugins/pkg/utils/buildversion"

	"github.com/portmap-dev/portmap/plugins/portmap"
)

func main() {
	skel.PluginMainFuncs(portmap.New().Funcs(), version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), bv.BuildString("portmap"))
}
