package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/portmap-dev/portmap/pkg/install"
)

// installMain is `portmap install --dest DIR`: it copies the running
// binary to DIR/portmap atomically (temporary file, fsync, rename), so a
// runtime never executes a half-written plugin. The DaemonSet's init
// container runs it into the host's CNI bin directory.
func installMain(args []string) int {
	fs := flag.NewFlagSet("portmap install", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	dest := fs.String("dest", "/opt/cni/bin", "the CNI plugin directory to install into")
	name := fs.String("name", "portmap", "the file name (the conflist's plugin type)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "portmap install: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	self, err := os.Executable()
	if err == nil {
		err = install.File(self, *dest, *name)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "portmap install:", err)
		return 1
	}
	fmt.Fprintf(os.Stdout, "installed %s/%s\n", *dest, *name)
	return 0
}
