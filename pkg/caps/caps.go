// Package caps names the Linux capabilities a process lacks when the
// kernel refuses it an operation, so that a component given fewer than
// one of its parts needs (the agent's container, say) can skip that part
// and say which, instead of failing as a whole.
package caps

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Cap is one capability.
type Cap struct {
	Name string
	bit  uint
}

var (
	BPF      = Cap{"CAP_BPF", unix.CAP_BPF}
	NetAdmin = Cap{"CAP_NET_ADMIN", unix.CAP_NET_ADMIN}
	Perfmon  = Cap{"CAP_PERFMON", unix.CAP_PERFMON}
	SysAdmin = Cap{"CAP_SYS_ADMIN", unix.CAP_SYS_ADMIN}
)

// Any is a need met by any one of its capabilities (CAP_BPF, or the
// CAP_SYS_ADMIN of kernels before 5.8).
type Any []Cap

func (a Any) String() string {
	names := make([]string, len(a))
	for i, c := range a {
		names[i] = c.Name
	}
	return strings.Join(names, " or ")
}

// Effective reports whether the calling thread has c in effect.
func Effective(c Cap) (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("capget: %w", err)
	}
	return data[c.bit/32].Effective&(1<<(c.bit%32)) != 0, nil
}

// Error is the kernel's refusal of an operation to a process that lacks
// capabilities it needs.
type Error struct {
	Missing []Any
	Err     error
}

func (e *Error) Error() string {
	names := make([]string, len(e.Missing))
	for i, a := range e.Missing {
		names[i] = a.String()
	}
	return fmt.Sprintf("%v (this process lacks %s)", e.Err, strings.Join(names, ", "))
}

func (e *Error) Unwrap() error { return e.Err }

// Explain returns err as an *Error naming the needs this process does
// not meet, when err is a refusal (EPERM, EACCES) and some need is
// unmet; otherwise err as it is: a refusal to a process with every
// capability asked for is another matter (a security module, a sysctl).
func Explain(err error, needs ...Any) error {
	if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EACCES) {
		return err
	}
	var missing []Any
	for _, need := range needs {
		met := false
		for _, c := range need {
			if ok, cerr := Effective(c); cerr == nil && ok {
				met = true
				break
			}
		}
		if !met {
			missing = append(missing, need)
		}
	}
	if len(missing) == 0 {
		return err
	}
	return &Error{Missing: missing, Err: err}
}
