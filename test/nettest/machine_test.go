package nettest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestChanged(t *testing.T) {
	for _, c := range []struct{ before, after, want string }{
		{"a\nb\n", "a\nb\n", ""},
		{"a\nb\n", "a\nc\n", "+ c\n- b\n"},
		{"a\n", "a\na\n", "+ a\n"},
		{"a\nb", "b\na", "before:\na\nbafter:\nb\na"},
	} {
		if got := Changed(c.before, c.after); got != c.want {
			t.Errorf("Changed(%q, %q) = %q, want %q", c.before, c.after, got, c.want)
		}
	}
}

// A dir given as a pattern lists the names that match it alone.
func TestFingerprintPattern(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"cni-1", "cnitest-2", "other"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	fp := Fingerprint(nil, []string{filepath.Join(dir, "cni-*"), dir})
	if !strings.Contains(fp, "dir "+filepath.Join(dir, "cni-*")+": "+filepath.Join(dir, "cni-1")+" false\n") ||
		!strings.Contains(fp, "dir "+dir+": cni-1 cnitest-2 other false\n") {
		t.Errorf("fingerprint:\n%s", fp)
	}
}
