package firewalld

import (
	"context"
	"fmt"
	"time"

	"github.com/godbus/dbus/v5"
)

// ConnectTimeout bounds the connection to the system bus: the dial, the
// authentication and the Hello call. godbus bounds none of them, and a
// bus daemon that is stopped (SIGSTOP, a hung dbus-broker) accepts the
// connection and never answers.
const ConnectTimeout = 2 * time.Second

// connect connects to the system bus before deadline. The attempt goes
// on in a goroutine of its own: past the deadline connect returns, the
// attempt is cancelled (which closes a connection under way: its reads
// return), and a connection it still makes is closed. The caller closes
// what it returns with done, which also ends the attempt's context.
func connect(deadline time.Time) (conn *dbus.Conn, done func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		conn *dbus.Conn
		err  error
	}
	got := make(chan result, 1)
	go func() {
		c, err := dbus.ConnectSystemBus(dbus.WithContext(ctx))
		got <- result{c, err}
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case r := <-got:
		if r.err != nil {
			cancel()
			return nil, nil, fmt.Errorf("system bus: %w", r.err)
		}
		return r.conn, func() { r.conn.Close(); cancel() }, nil
	case <-t.C:
		cancel()
		go func() {
			if r := <-got; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, nil, fmt.Errorf("system bus: %w", errSilent)
	}
}

// errSilent is a bus, or firewalld on it, that did not answer in time.
var errSilent = fmt.Errorf("no answer in %s", ConnectTimeout)
