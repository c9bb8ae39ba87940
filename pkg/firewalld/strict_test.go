package firewalld

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/test/nettest"
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

	if got, _, err := StrictForwardPorts(); got || err != nil {
		t.Errorf("without firewalld: %v, %v; want false, nil", got, err)
	}
	if err := os.Mkdir(etcDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, note, err := StrictForwardPorts(); got || err != nil || note != "" {
		t.Errorf("installed, no firewalld.conf, no bus: %v, %q, %v; want false, no note, nil", got, note, err)
	}
	if err := os.WriteFile(filepath.Join(etcDir, "firewalld.conf"), []byte("StrictForwardPorts=yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _, err := StrictForwardPorts(); !got || err != nil {
		t.Errorf("StrictForwardPorts=yes in firewalld.conf, no bus: %v, %v; want true, nil", got, err)
	}
}

// TestStrictForwardPortsOnAWedgedBus: where firewalld is installed and the
// system bus never answers (it accepts and says nothing, or does not
// accept: the kernel refuses the connection at once), ADD's question
// ends within ConnectTimeout, reads firewalld.conf instead and says
// why; the agent's Connect fails in that time too.
func TestStrictForwardPortsOnAWedgedBus(t *testing.T) {
	oldEtc := etcDir
	t.Cleanup(func() { etcDir = oldEtc })
	etcDir = t.TempDir()
	if err := os.WriteFile(filepath.Join(etcDir, "firewalld.conf"), []byte("StrictForwardPorts=yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, accept := range []bool{true, false} {
		t.Run(map[bool]string{true: "accepts, never answers", false: "never accepts"}[accept], func(t *testing.T) {
			bus := nettest.FullBus
			if accept {
				bus = nettest.WedgedBus
			}
			t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+bus(t))
			start := time.Now()
			strict, note, err := StrictForwardPorts()
			took := time.Since(start)
			t.Logf("StrictForwardPorts: %v, %q, %v after %s", strict, note, err, took.Round(time.Millisecond))
			why := map[bool]string{true: "no answer in 2s", false: "resource temporarily unavailable"}[accept]
			if !strict || err != nil || !strings.Contains(note, "firewalld.conf") || !strings.Contains(note, why) {
				t.Errorf("got %v, %q, %v; want firewalld.conf's yes, with a note saying %q", strict, note, err, why)
			}
			if took > ConnectTimeout+time.Second || accept && took < ConnectTimeout {
				t.Errorf("took %s, want at most the bound, %s", took, ConnectTimeout)
			}
			start = time.Now()
			b, err := Connect()
			took = time.Since(start)
			if err == nil {
				b.Close()
				t.Fatal("Connect to a bus that never answers succeeded")
			}
			if took > ConnectTimeout+time.Second || !strings.Contains(err.Error(), why) {
				t.Errorf("Connect: %v after %s, want no answer within %s", err, took, ConnectTimeout)
			}
		})
	}
}
