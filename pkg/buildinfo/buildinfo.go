// Package buildinfo says which build of portmap is running: the version
// stamped at link time (make build, make image) or the module version the
// Go toolchain derived, the VCS revision it recorded, the Go version, and
// the CNI versions the plugin serves. `portmap version`, the CNI VERSION
// verb's about text and the agent's metrics all name the same build.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is stamped by the Makefile:
//
//	-ldflags "-X github.com/portmap-dev/portmap/pkg/buildinfo.version=…"
//
// Empty: the module version from the build info is used.
var version string

// CNIVersions are the CNI spec versions the plugin serves.
var CNIVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Info is what is known of this build.
type Info struct {
	// Version is the stamped version, else the module version the
	// toolchain recorded ("v0.0.0-20261124…-abcdef123456+dirty" in a git
	// checkout, "(devel)" without VCS information).
	Version string `json:"version"`
	// Revision is the VCS revision ("" when built without VCS
	// information); Modified says the tree had uncommitted changes.
	Revision string   `json:"revision"`
	Time     string   `json:"time,omitempty"`
	Modified bool     `json:"modified"`
	Go       string   `json:"go"`
	Platform string   `json:"platform"`
	CNI      []string `json:"cniVersions"`
}

// Get reads this binary's build information.
func Get() Info {
	in := Info{Version: version, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH, CNI: CNIVersions}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if in.Version == "" {
			in.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Revision = s.Value
			case "vcs.time":
				in.Time = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	return in
}

// String is the one-line form: the CNI VERSION verb's about text and the
// first line of `portmap version`.
func (in Info) String() string {
	s := "CNI portmap plugin " + in.Version
	if in.Revision != "" && !strings.Contains(in.Version, short(in.Revision)) {
		s += " (" + short(in.Revision) + ")"
	}
	return s
}

// Long is what `portmap version` prints.
func (in Info) Long() string {
	var b strings.Builder
	fmt.Fprintln(&b, in.String())
	rev := in.Revision
	if rev == "" {
		rev = "unknown (built without VCS information)"
	}
	if in.Modified {
		rev += " (modified)"
	}
	fmt.Fprintf(&b, "  revision:     %s\n", rev)
	if in.Time != "" {
		fmt.Fprintf(&b, "  commit time:  %s\n", in.Time)
	}
	fmt.Fprintf(&b, "  go:           %s %s\n", in.Go, in.Platform)
	fmt.Fprintf(&b, "  CNI versions: %s\n", strings.Join(in.CNI, ", "))
	return b.String()
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
