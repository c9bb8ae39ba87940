package firewalld

import (
	"os"
	"path/filepath"
	"testing"
)

func TestConfStrict(t *testing.T) {
	for _, c := range []struct {
		name, conf string
		want       bool
	}{
		{"as shipped", "# StrictForwardPorts\n# If set to yes...\nStrictForwardPorts=no\n", false},
		{"on", "FirewallBackend=nftables\nStrictForwardPorts=yes\n", true},
		{"spaces and case", "  StrictForwardPorts = True  \n", true},
		{"any other value is on, as firewalld reads it", "StrictForwardPorts=1\n", true},
		{"false", "StrictForwardPorts=FALSE\n", false},
		{"the first definition counts", "StrictForwardPorts=yes\nStrictForwardPorts=no\n", true},
		{"an empty value is skipped", "StrictForwardPorts=\nStrictForwardPorts=yes\n", true},
		{"commented out", "#StrictForwardPorts=yes\n;StrictForwardPorts=yes\n", false},
		{"two equals signs are no definition", "StrictForwardPorts=yes=no\n", false},
		{"missing (firewalld 1.3)", "FirewallBackend=nftables\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "firewalld.conf")
			if err := os.WriteFile(f, []byte(c.conf), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := confStrict(f)
			if err != nil || got != c.want {
				t.Errorf("confStrict(%q) = %v, %v; want %v", c.conf, got, err, c.want)
			}
		})
	}
	if got, err := confStrict(filepath.Join(t.TempDir(), "none")); got || err != nil {
		t.Errorf("confStrict of a missing file = %v, %v; want false, nil", got, err)
	}
	if _, err := confStrict(t.TempDir()); err == nil {
		t.Error("confStrict of a directory: no error")
	}
}

// TestStrictForwardPortsFallsBackToTheFile: where no bus is reachable,
// StrictForwardPorts reads firewalld.conf; where firewalld is not
// installed, it is off.
func TestStrictForwardPortsFallsBackToTheFile(t *testing.T) {
	dir := t.TempDir()
	oldEtc, oldUsr := etcDir, usrDir
	t.Cleanup(func() { etcDir, usrDir = oldEtc, oldUsr })
	etcDir, usrDir = filepath.Join(dir, "etc"), filepath.Join(dir, "usr")
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+filepath.Join(dir, "no-bus"))

	if got, err := StrictForwardPorts(); got || err != nil {
		t.Errorf("without firewalld: %v, %v; want false, nil", got, err)
	}
	if err := os.Mkdir(etcDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := StrictForwardPorts(); got || err != nil {
		t.Errorf("installed, no firewalld.conf, no bus: %v, %v; want false, nil", got, err)
	}
	if err := os.WriteFile(filepath.Join(etcDir, "firewalld.conf"), []byte("StrictForwardPorts=yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := StrictForwardPorts(); !got || err != nil {
		t.Errorf("StrictForwardPorts=yes in firewalld.conf, no bus: %v, %v; want true, nil", got, err)
	}
}
