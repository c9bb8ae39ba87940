package main

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/test/nettest"
)

// nsHost is a network namespace of its own, made inside the benchmark's, and
// a thread that stays in it: whatever runs through do (a plugin's process,
// a socket) starts from that thread, so it is in that namespace. The
// latency rows give every N a host, filled once, and sample them in turn,
// so what the machine does in the meantime falls on every N alike.
type nsHost struct {
	n    int
	jobs chan func()
}

// newHost makes an nsHost for the row of n containers.
func newHost(n int) *nsHost {
	h := &nsHost{n: n, jobs: make(chan func())}
	errc := make(chan error)
	go func() {
		// Never unlocked: the thread is left in the namespace, and
		// the runtime ends it when this goroutine returns.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("host N=%d: new network namespace: %w", n, err)
			return
		}
		if err := nettest.SetupNetNS(); err != nil {
			errc <- fmt.Errorf("host N=%d: %w", n, err)
			return
		}
		errc <- nil
		for f := range h.jobs {
			f()
		}
	}()
	if err := <-errc; err != nil {
		fatalf("%v", err)
	}
	return h
}

// do runs f on the host's thread and returns when it is done.
func (h *nsHost) do(f func()) {
	done := make(chan struct{})
	h.jobs <- func() {
		defer close(done)
		f()
	}
	<-done
}

// close ends the host's thread, and with it the namespace once the last
// process in it has exited.
func (h *nsHost) close() { close(h.jobs) }
