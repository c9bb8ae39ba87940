package install

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFileReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(t.TempDir(), "portmap")
	if err := os.WriteFile(src, []byte("new binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(dir, "bin")
	if err := os.MkdirAll(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dest, "portmap"), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A runtime that has the old file open keeps reading the old content.
	old, err := os.Open(filepath.Join(dest, "portmap"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()

	if err := File(src, dest, "portmap"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dest, "portmap"))
	if err != nil || !bytes.Equal(got, []byte("new binary")) {
		t.Errorf("installed %q, %v", got, err)
	}
	fi, _ := os.Stat(filepath.Join(dest, "portmap"))
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", fi.Mode())
	}
	buf := make([]byte, 3)
	if _, err := old.Read(buf); err != nil || string(buf) != "old" {
		t.Errorf("the open old file reads %q, %v: the file was rewritten in place", buf, err)
	}
	entries, _ := os.ReadDir(dest)
	if len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
	// Into a directory that does not exist yet.
	if err := File(src, filepath.Join(dir, "new", "bin"), "portmap"); err != nil {
		t.Error(err)
	}
	if err := File(filepath.Join(dir, "missing"), dest, "portmap"); err == nil {
		t.Error("a missing source installed")
	}
}

// Each failure names what failed and leaves no temporary file behind: a
// source that is not there, a destination that is a file, a source that
// cannot be read, a name taken by a directory.
func TestFileFailures(t *testing.T) {
	src := filepath.Join(t.TempDir(), "portmap")
	if err := os.WriteFile(src, []byte("binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	taken := t.TempDir()
	if err := os.MkdirAll(filepath.Join(taken, "portmap", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, src, dir, want string
	}{
		{"no source", filepath.Join(t.TempDir(), "none"), t.TempDir(), "open "},
		{"destination is a file", src, file, "create " + file},
		{"source is a directory", t.TempDir(), t.TempDir(), "write "},
		{"name taken by a directory", src, taken, "rename to " + filepath.Join(taken, "portmap")},
	} {
		err := File(tt.src, tt.dir, "portmap")
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q…", tt.name, err, tt.want)
		}
		if left, _ := filepath.Glob(filepath.Join(tt.dir, ".portmap.tmp-*")); len(left) > 0 {
			t.Errorf("%s: temporary files left: %v", tt.name, left)
		}
	}
}
