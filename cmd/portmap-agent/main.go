// Command portmap-agent is the node agent of the portmap CNI plugin: sync
// (one pass, or with --watch the agent, and with --metrics-addr
// HOST:PORT /metrics in the Prometheus format and kube-proxy-like
// /healthz and /readyz; pkg/observe), list, version and help (pkg/cli).
// It is not a CNI plugin; the plugin binary, portmap, carries only what
// the CNI verbs run.
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
	a := cli.Agent{Metrics: func(interval time.Duration) cli.Observer {
		return observe.New(interval, nil)
	}}
	os.Exit(a.Program().Run(os.Args[1:]))
}
