package caps

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// onThreadWithout runs do on a thread of its own with drop out of its
// effective set; the thread ends with it (never handed back to Go).
func onThreadWithout(t *testing.T, drop []Cap, do func()) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			done <- err
			return
		}
		for _, c := range drop {
			data[c.bit/32].Effective &^= 1 << (c.bit % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- err
			return
		}
		do()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestExplain(t *testing.T) {
	if os.Geteuid() != 0 && os.Getenv("CI") != "true" {
		t.Skip("needs root: the capabilities are dropped from a thread that has them")
	}
	socketPath := []Any{{BPF, SysAdmin}, {NetAdmin}}
	for _, tc := range []struct {
		name string
		drop []Cap
		err  error
		want string // the missing needs, "" for err unchanged
	}{
		{"every capability: the refusal is another matter", nil, unix.EPERM, ""},
		{"not a refusal", []Cap{BPF, SysAdmin, NetAdmin}, unix.ENOENT, ""},
		{"CAP_SYS_ADMIN stands for CAP_BPF", []Cap{BPF}, unix.EPERM, ""},
		{"neither", []Cap{BPF, SysAdmin}, fmt.Errorf("load program: %w", unix.EPERM), "CAP_BPF or CAP_SYS_ADMIN"},
		{"the verifier's EACCES", []Cap{BPF, SysAdmin, NetAdmin}, unix.EACCES, "CAP_BPF or CAP_SYS_ADMIN, CAP_NET_ADMIN"},
		{"attach alone", []Cap{NetAdmin}, unix.EPERM, "CAP_NET_ADMIN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got error
			onThreadWithout(t, tc.drop, func() { got = Explain(tc.err, socketPath...) })
			var e *Error
			switch {
			case tc.want == "" && got != tc.err:
				t.Errorf("Explain = %v, want %v unchanged", got, tc.err)
			case tc.want != "" && !errors.As(got, &e):
				t.Errorf("Explain = %v, want an *Error", got)
			case tc.want != "" && !strings.HasSuffix(got.Error(), "(this process lacks "+tc.want+")"):
				t.Errorf("Explain = %q, want it to name %s", got, tc.want)
			case tc.want != "" && !errors.Is(got, tc.err):
				t.Errorf("Explain = %v, does not wrap %v", got, tc.err)
			}
		})
	}
}
