// Package child runs the node's tools (iptables-restore, iptables -S,
// nft -f) as child processes with a deadline: a tool that hangs (a
// wedged netlink socket, a stuck NFS-mounted binary, a lock it waits for
// without its own bound) is killed, and the verb or pass goes on or fails
// naming it, instead of hanging the pod's sandbox or the agent.
package child

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"github.com/portmap-dev/portmap/pkg/deadline"
)

// Timeout is how long a tool may run: the 20 s the iptables tools wait
// for the xtables lock (-w 20), and 10 s of work beside it. A variable
// for tests.
var Timeout = 30 * time.Second

// ErrTimeout is a tool killed at its deadline.
var ErrTimeout = errors.New("no answer within the deadline")

// Cmd is a tool's command with its deadline.
type Cmd struct {
	*exec.Cmd
	ctx    context.Context
	cancel context.CancelFunc
	bound  time.Duration
}

// Command is exec.Command with a deadline of Timeout from now, or the
// verb's or pass's where that comes sooner (pkg/deadline); Run or Output
// it once.
func Command(name string, args ...string) *Cmd {
	bound := deadline.Within(Timeout)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	cmd := exec.CommandContext(ctx, name, args...)
	// a grandchild holding the pipes open may not keep Wait past it
	cmd.WaitDelay = time.Second
	return &Cmd{Cmd: cmd, ctx: ctx, cancel: cancel, bound: bound}
}

// Run runs the command; one killed at its deadline fails wrapping
// ErrTimeout.
func (c *Cmd) Run() error {
	defer c.cancel()
	return c.wrap(c.Cmd.Run())
}

// Output runs the command and returns its standard output, as Run.
func (c *Cmd) Output() ([]byte, error) {
	defer c.cancel()
	out, err := c.Cmd.Output()
	return out, c.wrap(err)
}

func (c *Cmd) wrap(err error) error {
	if err != nil && errors.Is(c.ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s killed after %s: %w (%w)", c.Path, c.bound, ErrTimeout, err)
	}
	return err
}
