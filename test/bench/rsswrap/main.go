// Command rsswrap runs a command and reports on file descriptor 3 how long
// it ran (ns) and its peak resident memory (KiB), for the benchmark.
//
// The benchmark cannot read a plugin's peak from its own children: os/exec
// starts them with vfork, and exec carries the parent's high-water mark
// into the child's, so every plugin it ran reported the benchmark's own
// size (9–31 MiB, growing with the run). Started from this small process
// instead, a plugin's peak is its own.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rsswrap command [args…] (report on fd 3)")
		os.Exit(2)
	}
	report := os.NewFile(3, "report")
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if cmd.ProcessState == nil {
		fmt.Fprintf(os.Stderr, "rsswrap: %v\n", err)
		os.Exit(127)
	}
	var kb int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		kb = ru.Maxrss
	}
	fmt.Fprintf(report, "%d %d\n", d.Nanoseconds(), kb)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		os.Exit(ee.ExitCode())
	}
}
