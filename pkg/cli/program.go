package cli

import (
	"context"

	"github.com/portmap-dev/portmap/pkg/cmdline"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/nfevents"
)

// Program is portmap-agent's command line.
func (a Agent) Program() cmdline.Program {
	if a.Host == nil {
		a.Host = host.Real
	}
	if a.Chroot == nil {
		a.Chroot = chroot
	}
	if a.Events == nil {
		a.Events = nfevents.Subscribe
	}
	if a.Context == nil {
		a.Context = context.Background()
	}
	return cmdline.Program{
		Name: "portmap-agent",
		Intro: `the node agent of the portmap CNI plugin.

It keeps the plugin's host ports in line with libcni's cache (sync --watch)
and, with --metrics-addr, serves /metrics, /healthz and /readyz; it lists
the host-port table (list). It is not a CNI plugin: the plugin is portmap.
Its commands:`,
		Commands: []cmdline.Command{
			{Name: "sync", Summary: "bring the host ports to what libcni's cache holds; --watch: the node agent", Run: a.syncMain},
			{Name: "list", Summary: "this host's host-port table, every backend and layer", Run: a.listMain},
		},
	}
}
