// Package stdinpipe gives the request a runtime writes to the plugin's
// stdin room in its pipe. A pipe holds 64 KiB; a Podman range of 5000
// ports is a 330 KB request, so the runtime's writer fills the pipe and
// waits, and a reader that takes what is there and asks for more wakes
// it for every part, a round trip each. Widened as the program starts,
// the pipe takes the rest of the request while the program readies the
// verb, and it is read in one go.
package stdinpipe

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Room is the size a pipe is widened to: a request of up to this much
// is then written at once.
const Room = 1 << 20

// Widen gives the pipe at fd Room when it is full (its writer then
// waits for room): false, with nothing changed, for anything else — not
// a pipe, a pipe not full (its writer has written all it had, or has
// yet to write), or a widening the kernel refuses (a user over its pipe
// pages).
func Widen(fd int) bool {
	size, err := unix.FcntlInt(uintptr(fd), unix.F_GETPIPE_SZ, 0)
	if err != nil || size >= Room {
		return false
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD: the bytes it holds
	if err != nil || n < size {
		return false
	}
	return Grow(fd)
}

// Grow gives the pipe at fd Room, full or not; false when fd is no pipe
// or the kernel refuses.
func Grow(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, Room)
	return err == nil
}

// Reader reads f, giving a pipe whose first read fills 64 KiB (its
// writer then waits for room, and Widen came too early to see it) Room
// for the rest.
func Reader(f *os.File) io.Reader { return &reader{f: f} }

type reader struct {
	f    *os.File
	read bool
}

func (r *reader) Read(b []byte) (int, error) {
	n, err := r.f.Read(b)
	if !r.read {
		r.read = true
		if n >= 64<<10 && err == nil {
			Grow(int(r.f.Fd())) // not a pipe, or refused: rounds it is
		}
	}
	return n, err
}
