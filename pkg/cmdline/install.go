package cmdline

import (
	"fmt"

	"github.com/portmap-dev/portmap/pkg/install"
)

// Install is `portmap install --dest DIR`: it copies the binary
// executable names (os.Executable) to DIR/portmap atomically (temporary
// file, fsync, rename), so a runtime never executes a half-written
// plugin. The DaemonSet's init container runs it into the host's CNI bin
// directory.
func Install(executable func() (string, error)) Command {
	return Command{"install", "copy this binary into a CNI plugin directory, atomically", func(p Program, args []string) int {
		fs := p.Flags("install", "[--dest DIR] [--name NAME]",
			"Copy this binary to DIR/NAME atomically (a temporary file, fsync, rename):\n"+
				"a runtime never runs a half-written plugin. The DaemonSet's init container\n"+
				"runs it into the host's CNI plugin directory.")
		dest := fs.String("dest", "/opt/cni/bin", "the CNI plugin directory to install into")
		name := fs.String("name", "portmap", "the file name (the conflist's plugin type)")
		if code, done := p.Parse(fs, args); done {
			return code
		}
		self, err := executable()
		if err == nil {
			err = install.File(self, *dest, *name)
		}
		if err != nil {
			fmt.Fprintln(p.Stderr, p.Name+" install:", err)
			return 1
		}
		fmt.Fprintf(p.Stdout, "installed %s/%s\n", *dest, *name)
		return 0
	}}
}
