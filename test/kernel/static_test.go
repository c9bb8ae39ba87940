package kernel

import (
	"debug/elf"
	"path/filepath"
	"testing"

	"github.com/portmap-dev/portmap/test/nettest"
)

// TestBinariesAreStatic: the plugin and the agent are built without cgo,
// as the CNI plugins' releases are, so they need no dynamic loader and no
// libc of the build host's version on the node (a cgo build asks for
// glibc 2.34, which older nodes lack).
func TestBinariesAreStatic(t *testing.T) {
	for _, name := range []string{"portmap", "portmap-agent"} {
		f, err := elf.Open(filepath.Join(nettest.BinDir(), name))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has a program interpreter: a dynamically linked binary", name)
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("%s imports %q (%v), want none", name, libs, err)
		}
		f.Close()
	}
}
