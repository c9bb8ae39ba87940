package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestID(t *testing.T) {
	a, err := ID()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ID()
	if a != b || !(strings.HasPrefix(a, "cookie-") || strings.HasPrefix(a, "inode-")) {
		t.Errorf("ID %q then %q, want one stable name", a, b)
	}
}

// Without cookies (a kernel before 5.14) the namespace is named by its
// file's inode; without that file, ID fails.
func TestIDWithoutCookies(t *testing.T) {
	none := func() (uint64, error) { return 0, errors.New("ENOPROTOOPT") }
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	if got, err := id(none, "/proc/thread-self/ns/net"); err != nil || got != fmt.Sprintf("inode-%d", st.Ino) {
		t.Errorf("id without cookies: %q %v, want inode-%d", got, err, st.Ino)
	}
	if got, err := id(none, filepath.Join(t.TempDir(), "none")); err == nil {
		t.Errorf("id without cookies or the namespace's file: %q, want an error", got)
	}
	if got, err := id(func() (uint64, error) { return 7, nil }, ""); err != nil || got != "cookie-7" {
		t.Errorf("id with a cookie: %q %v", got, err)
	}
}

func TestGone(t *testing.T) {
	dir := t.TempDir()
	alive := filepath.Join(dir, "alive")
	if err := os.WriteFile(alive, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		gone bool
	}{
		{"", false},
		{alive, false},
		{filepath.Join(dir, "deleted"), true},
		// A directory this process does not see: it cannot tell.
		{filepath.Join(dir, "not-mounted-here", "c1"), false},
		// A process's namespace: meaningful in the runtime's PID namespace only.
		{"/proc/999999999/ns/net", false},
		{"relative/c1", false},
	}
	for _, tt := range tests {
		if got := Gone(tt.path); got != tt.gone {
			t.Errorf("Gone(%q) = %t, want %t", tt.path, got, tt.gone)
		}
	}
}
