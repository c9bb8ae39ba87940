// Package cli is the node agent's command line, portmap-agent's: sync,
// one pass or, with --watch, the agent itself (with /metrics, /healthz
// and /readyz), and list, the host-port table — commands of a
// cmdline.Program. The plugin binary carries none of it.
package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/nfevents"
)

// Agent is what the agent's commands are given of the process, as skel
// gives a plugin's verbs their streams and environment: Program fills
// what is nil with the real one, and tests run the commands in process
// with their own.
type Agent struct {
	// Host opens the node the commands act on (host.Real), after sync's
	// --root chroot.
	Host func(log io.Writer) *host.Host
	// Chroot enters sync's --root (syscall.Chroot, then chdir "/").
	Chroot func(dir string) error
	// Events subscribes `sync --watch` to the firewall's changes
	// (nfevents.Subscribe).
	Events func() (*nfevents.Subscription, error)
	// Context ends `sync --watch` when done; SIGTERM and SIGINT end it
	// too (context.Background).
	Context context.Context
	// Metrics makes `sync --watch --metrics-addr` serve metrics and
	// probes through the observer it returns for a watcher passing every
	// interval.
	Metrics func(interval time.Duration) Observer
}

// Observer is what the agent binary adds to the watcher: it is told of
// every pass and event and serves /metrics, /healthz and /readyz.
type Observer interface {
	Pass(agent.PassInfo)
	Event()
	Reload()
	Serve(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error)
}

// chroot enters dir as the process's root.
func chroot(dir string) error {
	if err := syscall.Chroot(dir); err != nil {
		return fmt.Errorf("chroot %s: %w", dir, err)
	}
	return os.Chdir("/")
}
