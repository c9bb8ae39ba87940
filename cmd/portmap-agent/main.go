// Command portmap-agent is the node agent of the portmap CNI plugin: the
// commands of portmap (sync, list, version, help; pkg/cli) with, for
// `sync --watch --metrics-addr HOST:PORT`, /metrics in the Prometheus
// format and kube-proxy-like /healthz and /readyz (pkg/observe). It is
// not a CNI plugin; the plugin binary, portmap, links no HTTP server.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/portmap-dev/portmap/pkg/cli"
	"github.com/portmap-dev/portmap/pkg/observe"
)

func main() {
	if os.Getenv("CNI_COMMAND") != "" {
		fmt.Fprintln(os.Stderr, "portmap-agent is the node agent, not a CNI plugin: the plugin is portmap")
		os.Exit(1)
	}
	p := cli.Program{Name: "portmap-agent", Metrics: func(interval time.Duration) cli.Observer {
		return observe.New(interval, nil)
	}}
	os.Exit(p.Run(os.Args[1:]))
}
