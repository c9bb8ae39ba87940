// Package sdnotify speaks systemd's service notification protocol
// (sd_notify(3)) by hand: one datagram of "KEY=VALUE" lines to the
// AF_UNIX socket named by $NOTIFY_SOCKET ('@' for the abstract
// namespace). A unit of Type=notify is started once READY=1 arrives; with
// WatchdogSec= it is restarted when WATCHDOG=1 stops arriving.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"
)

// Notifier sends states to the service manager.
type Notifier struct {
	addr *net.UnixAddr
}

// FromEnv returns the notifier $NOTIFY_SOCKET names, or nil when the
// process was not started by a service manager that listens.
func FromEnv() *Notifier {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return nil
	}
	if name[0] == '@' {
		name = "\x00" + name[1:]
	}
	return &Notifier{addr: &net.UnixAddr{Name: name, Net: "unixgram"}}
}

// Notify sends state ("READY=1", "WATCHDOG=1", "STOPPING=1",
// "STATUS=…"); a nil Notifier sends nothing.
func (n *Notifier) Notify(state string) error {
	if n == nil {
		return nil
	}
	c, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("notify %s: %w", n.addr.Name, err)
	}
	defer c.Close()
	// A listener that does not read must not stall the caller's loop.
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify %s: %w", n.addr.Name, err)
	}
	return nil
}

// WatchdogInterval is how often to send WATCHDOG=1: half of the
// $WATCHDOG_USEC the service manager set (sd_watchdog_enabled), or 0
// when there is no watchdog for this process.
func WatchdogInterval() time.Duration {
	usec, err := strconv.ParseUint(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec == 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0 // meant for another process
	}
	return time.Duration(usec) * time.Microsecond / 2
}
