package portmap

import (
	"flag"
	"fmt"
	"os"

	"github.com/portmap-dev/portmap/pkg/install"
)

// InstallMain is `portmap install --dest DIR`: it copies the running
// binary to DIR/portmap atomically (temporary file, fsync, rename), so a
// runtime never executes a half-written plugin. The DaemonSet's init
// container runs it into the host's CNI bin directory.
func InstallMain(p *Plugin, args []string) int {
	fs := flag.NewFlagSet("portmap install", flag.ContinueOnError)
	fs.SetOutput(p.Stderr)
	dest := fs.String("dest", "/opt/cni/bin", "the CNI plugin directory to install into")
	name := fs.String("name", "portmap", "the file name (the conflist's plugin type)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(p.Stderr, "portmap install: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	self, err := os.Executable()
	if err == nil {
		err = install.File(self, *dest, *name)
	}
	if err != nil {
		fmt.Fprintln(p.Stderr, "portmap install:", err)
		return 1
	}
	fmt.Fprintf(p.Stdout, "installed %s/%s\n", *dest, *name)
	return 0
}
