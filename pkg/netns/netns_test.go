package netns

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
