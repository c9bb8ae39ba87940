// Command rsswrap runs a command and reports on file descriptor 3 how long
// it ran (ns), its peak resident memory (KiB) and its private memory when
// it exited (KiB), for the benchmark.
//
// The benchmark cannot read a plugin's peak from its own children: os/exec
// starts them with vfork, and exec carries the parent's high-water mark
// into the child's, so every plugin it ran reported the benchmark's own
// size (9–31 MiB, growing with the run). Started from this small process
// instead, a plugin's peak is its own.
//
// The peak counts the pages of the binary the process touched, which the
// page cache shares between every process of that binary; the private
// memory (RssAnon: heap, stacks, the runtime's data) is what each more
// process at once costs. rsswrap reads it at the process's exit stop
// (ptrace's PTRACE_EVENT_EXIT, before its memory is torn down); a Go
// process of a few milliseconds gives none of it back before then.
package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rsswrap command [args…] (report on fd 3)")
		os.Exit(2)
	}
	report := os.NewFile(3, "report")
	// ptrace requests come from the thread that started the tracee.
	runtime.LockOSThread()
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "rsswrap: %v\n", err)
		os.Exit(127)
	}
	ws, ru, private, err := trace(cmd.Process.Pid)
	d := time.Since(start)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rsswrap: %v\n", err)
		os.Exit(127)
	}
	fmt.Fprintf(report, "%d %d %d\n", d.Nanoseconds(), ru.Maxrss, private)
	switch {
	case ws.Exited():
		os.Exit(ws.ExitStatus())
	case ws.Signaled():
		os.Exit(128 + int(ws.Signal()))
	}
}

// trace runs the tracee stopped at its exec to its end, passing its
// signals on, and reads its private memory at its exit stop.
func trace(pid int) (syscall.WaitStatus, syscall.Rusage, int64, error) {
	var ws syscall.WaitStatus
	var ru syscall.Rusage
	var private int64
	if _, err := syscall.Wait4(pid, &ws, 0, &ru); err != nil {
		return ws, ru, 0, fmt.Errorf("wait for the exec stop: %w", err)
	}
	if err := syscall.PtraceSetOptions(pid, syscall.PTRACE_O_TRACEEXIT); err != nil {
		return ws, ru, 0, fmt.Errorf("ptrace options: %w", err)
	}
	signal := 0
	for {
		if err := syscall.PtraceCont(pid, signal); err != nil {
			return ws, ru, 0, fmt.Errorf("ptrace continue: %w", err)
		}
		if _, err := syscall.Wait4(pid, &ws, 0, &ru); err != nil {
			return ws, ru, 0, fmt.Errorf("wait: %w", err)
		}
		switch {
		case ws.Exited() || ws.Signaled():
			return ws, ru, private, nil
		case ws.Stopped() && ws.TrapCause() == syscall.PTRACE_EVENT_EXIT:
			kb, err := statusKB(pid, "RssAnon")
			if err != nil {
				return ws, ru, 0, err
			}
			private, signal = kb, 0
		case ws.Stopped():
			signal = int(ws.StopSignal())
		}
	}
}

// statusKB reads one "Name: n kB" line of /proc/pid/status.
func statusKB(pid int, name string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), name+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, name)
}
