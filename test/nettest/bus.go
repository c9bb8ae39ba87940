package nettest

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// WedgedBus makes a system bus socket that never answers, removed when
// the test ends, and returns its path: with accept, one that accepts
// connections and says nothing (a stopped dbus-daemon, a hung
// dbus-broker); without, one whose backlog is full, so that the kernel
// refuses a connection at once (Go's dial does not wait for room).
func WedgedBus(tb TB) string { return wedgedBus(tb, true) }

// FullBus is WedgedBus without accept.
func FullBus(tb TB) string { return wedgedBus(tb, false) }

func wedgedBus(tb TB, accept bool) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "bus") // a D-Bus address takes no comma: not tb.TempDir()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "system_bus_socket")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		unix.Close(fd)
		tb.Fatal(err)
	}
	backlog := 64
	if !accept {
		backlog = 0
	}
	if err := unix.Listen(fd, backlog); err != nil {
		unix.Close(fd)
		tb.Fatal(err)
	}
	held := make(chan int, 256)
	tb.Cleanup(func() {
		unix.Shutdown(fd, unix.SHUT_RDWR)
		unix.Close(fd)
		for {
			select {
			case c := <-held:
				unix.Close(c)
			default:
				return
			}
		}
	})
	if !accept {
		// fill the backlog: the next connect finds no room
		for range 3 {
			c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				tb.Fatal(err)
			}
			_ = unix.Connect(c, &unix.SockaddrUnix{Name: sock}) // EAGAIN once full
			held <- c
		}
		return sock
	}
	go func() {
		for {
			c, _, err := unix.Accept(fd)
			if err != nil {
				return
			}
			select {
			case held <- c: // held open, never answered
			default:
				unix.Close(c)
			}
		}
	}()
	return sock
}
