package stdinpipe

import (
	"bytes"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pipe returns a pipe whose write end does not block, and its size.
func pipe(t *testing.T) (r, w *os.File, size int) {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	r, w = os.NewFile(uintptr(fds[0]), "r"), os.NewFile(uintptr(fds[1]), "w")
	t.Cleanup(func() { r.Close(); w.Close() })
	size, err := unix.FcntlInt(w.Fd(), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r, w, size
}

// fill writes to w until it would block, and says how much it wrote.
func fill(t *testing.T, w *os.File) int {
	t.Helper()
	buf := make([]byte, 4096)
	n := 0
	for {
		k, err := unix.Write(int(w.Fd()), buf)
		n += max(k, 0)
		if err == unix.EAGAIN {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestWiden(t *testing.T) {
	t.Run("a full pipe takes the rest of a request at once", func(t *testing.T) {
		r, w, size := pipe(t)
		if got := fill(t, w); got != size {
			t.Fatalf("filled %d bytes of a %d-byte pipe", got, size)
		}
		if !Widen(int(r.Fd())) {
			t.Fatal("a full pipe was not widened")
		}
		if got, _ := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0); got != Room {
			t.Errorf("pipe size %d, want %d", got, Room)
		}
		if more := fill(t, w); more != Room-size {
			t.Errorf("the writer wrote %d bytes more, want %d", more, Room-size)
		}
		if Widen(int(r.Fd())) {
			t.Error("a pipe of Room widened again")
		}
	})
	t.Run("a pipe not full is left as it is", func(t *testing.T) {
		if os.Getenv("PORTMAP_QEMU_USER") != "" {
			t.Skip("qemu-user answers FIONREAD on a pipe with the pipe's size")
		}
		r, w, size := pipe(t)
		if _, err := w.Write([]byte(`{"cniVersion":"1.0.0"}`)); err != nil {
			t.Fatal(err)
		}
		if Widen(int(r.Fd())) {
			t.Error("a pipe holding a small request was widened")
		}
		if got, _ := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0); got != size {
			t.Errorf("pipe size %d, want %d", got, size)
		}
		if !Grow(int(r.Fd())) {
			t.Error("Grow refused a pipe")
		}
	})
	t.Run("no pipe", func(t *testing.T) {
		f, err := os.CreateTemp(t.TempDir(), "stdin")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(make([]byte, 1<<17)); err != nil {
			t.Fatal(err)
		}
		if Widen(int(f.Fd())) || Grow(int(f.Fd())) {
			t.Error("a file was taken for a pipe")
		}
	})
}

// Reader reads a request through a pipe whole: one whose first read of
// 64 KiB finds the pipe full has the pipe grown for the rest, a small
// one leaves it.
func TestReader(t *testing.T) {
	for _, tt := range []struct {
		name string
		size int
		grow bool
	}{{"small", 4 << 10, false}, {"a range's", 300 << 10, true}} {
		t.Run(tt.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			want := bytes.Repeat([]byte("0123456789abcdef"), tt.size/16)
			go func() { _, _ = w.Write(want); w.Close() }()
			for { // the first read must find the pipe full, as a runtime's would be
				n, err := unix.IoctlGetInt(int(r.Fd()), unix.TIOCINQ) // FIONREAD
				if err != nil || n >= min(tt.size, 64<<10) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			var got []byte
			rd, buf := Reader(r), make([]byte, 64<<10) // a window, as attach.Read reads
			for {
				n, err := rd.Read(buf)
				got = append(got, buf[:n]...)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes; want the %d written", len(got), len(want))
			}
			size, err := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0)
			if err != nil {
				t.Fatal(err)
			}
			if grown := size > 64<<10; grown != tt.grow {
				t.Errorf("pipe of %d bytes after the read, grown %v; want grown %v", size, grown, tt.grow)
			}
		})
	}
}
