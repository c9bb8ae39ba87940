package portmap

import (
	"bytes"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// readAll reads a request through a pipe whole; one that fills the
// pipe's 64 KiB has the pipe grown for the rest, a small one leaves it.
func TestReadAll(t *testing.T) {
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
			got, err := readAll(r)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes, %v; want the %d written", len(got), err, len(want))
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
