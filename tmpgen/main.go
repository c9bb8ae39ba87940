package main

import (
	"github.com/containernetworking/cni/pkg/version"

	"github.com/portmap-dev/portmap/pkg/buildinfo"
	"github.com/portmap-dev/portmap/pkg/stdinpipe"
	"github.com/portmap-dev/portmap/plugins/portmap"
)

func main() {
	stdinpipe.Widen(0)
	portmap.New().Serve(version.PluginSupports(buildinfo.CNIVersions...), buildinfo.Get().String())
}
