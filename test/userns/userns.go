// Package userns runs a package's unit tests in a user and a network
// namespace of their own, without root: there the test process holds
// CAP_NET_ADMIN over a network namespace nothing else uses, so the tests
// of code that speaks to the kernel's firewall (nfnetlink) talk to a real
// kernel, change nothing of the machine's, and need no privilege.
//
//	func TestMain(m *testing.M) { userns.Main(m) }
//
// and in each test that needs the kernel, userns.Require(t) first.
package userns

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// marker tells the re-executed test binary where it runs: "1" in its own
// namespaces, or why they could not be made.
const marker = "PORTMAP_TEST_USERNS"

// Main runs the test binary again, with the same arguments (coverage
// profiles included), in a new user namespace (the caller's user mapped
// to root) and a new network namespace, and exits with its status. Where
// the namespaces cannot be made, the tests run here and Require says so.
func Main(m *testing.M) {
	if os.Getenv(marker) == "" {
		err := reexec()
		var ee *exec.ExitError
		switch {
		case err == nil:
			os.Exit(0)
		case errors.As(err, &ee):
			os.Exit(ee.ExitCode())
		}
		os.Setenv(marker, "cannot make a user and network namespace: "+err.Error())
	}
	os.Exit(m.Run())
}

func reexec() error {
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), marker+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	return cmd.Run()
}

// Require returns when the test runs in namespaces of its own (Main);
// else it skips, saying why — or, under CI, fails.
func Require(t testing.TB) {
	t.Helper()
	v := os.Getenv(marker)
	if v == "1" {
		return
	}
	if v == "" {
		v = "the package's TestMain does not call userns.Main"
	}
	if emu := os.Getenv("PORTMAP_QEMU_USER"); emu != "" {
		// make cross-test: the emulator cannot re-execute itself into a
		// namespace; these tests run natively in make test
		t.Skipf("under %s: %s", emu, v)
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(v)
	}
	t.Skip(v)
}
