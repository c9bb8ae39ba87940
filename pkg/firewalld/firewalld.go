// Package firewalld is what portmap needs of firewalld: for the node
// agent, its Reloaded signal on the system bus, sent when a reload (which
// flushes the iptables tables) is done, and whether a reload is under
// way; for ADD, whether its StrictForwardPorts drops host ports.
package firewalld

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/godbus/dbus/v5"
)

// firewalld's bus name, object and interface.
const (
	name  = "org.fedoraproject.FirewallD1"
	path  = dbus.ObjectPath("/org/fedoraproject/FirewallD1")
	iface = "org.fedoraproject.FirewallD1"
)

// Bus is a connection to the system bus subscribed to firewalld's
// Reloaded signal and to its starts.
type Bus struct {
	conn     *dbus.Conn
	done     func()
	reloaded chan string
}

// What Reloaded says: firewalld reloaded, or started (it applies its
// rules as it starts, flushing as a reload does).
const (
	Reloaded = "reloaded"
	Started  = "started"
)

// Connect connects to the system bus (DBUS_SYSTEM_BUS_ADDRESS, else
// /run/dbus/system_bus_socket) and subscribes to firewalld's Reloaded
// signal and to the bus's word that firewalld took its name (a start),
// whether or not firewalld runs now (it may start later). A bus that
// has not answered all of it within ConnectTimeout is an error.
func Connect() (*Bus, error) {
	deadline := time.Now().Add(ConnectTimeout)
	conn, done, err := connect(deadline)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := conn.AddMatchSignalContext(ctx, dbus.WithMatchObjectPath(path), dbus.WithMatchInterface(iface), dbus.WithMatchMember("Reloaded")); err != nil {
		done()
		return nil, fmt.Errorf("subscribe to firewalld's Reloaded signal: %w", err)
	}
	if err := conn.AddMatchSignalContext(ctx, dbus.WithMatchSender("org.freedesktop.DBus"), dbus.WithMatchInterface("org.freedesktop.DBus"),
		dbus.WithMatchMember("NameOwnerChanged"), dbus.WithMatchArg(0, name)); err != nil {
		done()
		return nil, fmt.Errorf("subscribe to firewalld's starts: %w", err)
	}
	b := &Bus{conn: conn, done: done, reloaded: make(chan string, 1)}
	signals := make(chan *dbus.Signal, 16)
	conn.Signal(signals)
	go func() {
		for s := range signals {
			what := ""
			switch {
			case s.Path == path && s.Name == iface+".Reloaded":
				what = Reloaded
			case s.Name == "org.freedesktop.DBus.NameOwnerChanged" && len(s.Body) == 3 && s.Body[0] == name && s.Body[2] != "":
				what = Started
			default:
				continue
			}
			select {
			case b.reloaded <- what:
			default: // one pending is enough: the pass reads the state after it
			}
		}
		close(b.reloaded)
	}()
	return b, nil
}

// Reloaded receives Reloaded after firewalld finished a reload, Started
// once it took its name on the bus as it starts (a pass then waits in
// Settle until it has applied its rules); it is closed when the
// connection ends.
func (b *Bus) Reloaded() <-chan string { return b.reloaded }

// Settle returns once firewalld is not reloading, waiting up to timeout:
// firewalld serves the bus one call at a time, and a reload is one, so
// it answers a call only after a reload under way. It returns at once
// where firewalld is not on the bus.
func (b *Bus) Settle(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	call := b.conn.Object(name, path).CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", dbus.FlagNoAutoStart, iface, "state")
	switch errName(call.Err) {
	case "":
		return nil
	case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner":
		return nil // no firewalld: nothing to wait for
	default:
		return fmt.Errorf("ask firewalld whether it is reloading: %w", call.Err)
	}
}

// Close ends the connection.
func (b *Bus) Close() error { b.done(); return nil }

// errName is the D-Bus error name of err: "" for nil, "?" for an error
// that is not a D-Bus error reply (a timeout, a closed connection).
func errName(err error) string {
	var p *dbus.Error
	var v dbus.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &p):
		return p.Name
	case errors.As(err, &v): // godbus answers both ways
		return v.Name
	}
	return "?"
}
