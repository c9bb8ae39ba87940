package buildinfo

import (
	"runtime"
	"testing"
)

// The one-line and the long forms of a build, stamped or not, with or
// without VCS information.
func TestForms(t *testing.T) {
	cni := []string{"0.4.0", "1.1.0"}
	for _, tt := range []struct {
		in         Info
		line, long string
	}{
		{Info{Version: "v1.2.0", Revision: "0123456789abcdef", Time: "2026-11-26T00:00:00Z", Go: "go1.26", Platform: "linux/amd64", CNI: cni},
			"CNI portmap plugin v1.2.0 (0123456789ab)",
			"CNI portmap plugin v1.2.0 (0123456789ab)\n  revision:     0123456789abcdef\n  commit time:  2026-11-26T00:00:00Z\n  go:           go1.26 linux/amd64\n  CNI versions: 0.4.0, 1.1.0\n"},
		{Info{Version: "v0.0.0-20261126-0123456789ab+dirty", Revision: "0123456789abcdef", Modified: true, Go: "go1.26", Platform: "linux/arm64", CNI: cni},
			"CNI portmap plugin v0.0.0-20261126-0123456789ab+dirty",
			"CNI portmap plugin v0.0.0-20261126-0123456789ab+dirty\n  revision:     0123456789abcdef (modified)\n  go:           go1.26 linux/arm64\n  CNI versions: 0.4.0, 1.1.0\n"},
		{Info{Version: "(devel)", Revision: "abc", Go: "go1.26", Platform: "linux/amd64", CNI: cni},
			"CNI portmap plugin (devel) (abc)",
			"CNI portmap plugin (devel) (abc)\n  revision:     abc\n  go:           go1.26 linux/amd64\n  CNI versions: 0.4.0, 1.1.0\n"},
		{Info{Version: "(devel)", Go: "go1.26", Platform: "linux/amd64", CNI: cni},
			"CNI portmap plugin (devel)",
			"CNI portmap plugin (devel)\n  revision:     unknown (built without VCS information)\n  go:           go1.26 linux/amd64\n  CNI versions: 0.4.0, 1.1.0\n"},
	} {
		if got := tt.in.String(); got != tt.line {
			t.Errorf("String() = %q, want %q", got, tt.line)
		}
		if got := tt.in.Long(); got != tt.long {
			t.Errorf("Long() =\n%s\nwant\n%s", got, tt.long)
		}
	}
}

// Get reads the test binary's own build: the toolchain, the platform,
// the CNI versions, a version, and the stamp where there is one.
func TestGet(t *testing.T) {
	in := Get()
	if in.Go != runtime.Version() || in.Platform != runtime.GOOS+"/"+runtime.GOARCH || len(in.CNI) != len(CNIVersions) || in.Version == "" {
		t.Errorf("Get() = %+v", in)
	}
	defer func(v string) { version = v }(version)
	version = "v9.9.9"
	if got := Get().Version; got != "v9.9.9" {
		t.Errorf("stamped version: %q", got)
	}
}
