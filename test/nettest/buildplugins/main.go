// Command buildplugins builds every binary the tests, the demo and the
// benchmark run into the directory it is given (`make plugins`), from
// go.mod's tool block: see nettest.BuildPlugins.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/portmap-dev/portmap/test/nettest"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: buildplugins DIR")
		os.Exit(2)
	}
	dir, err := filepath.Abs(os.Args[1])
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		err = nettest.BuildPlugins(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "buildplugins:", err)
		os.Exit(1)
	}
}
