package nodesafety

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/test/nettest"
)

// legacyTools puts iptables-legacy first on PATH, under the names the
// plugin runs, until the test ends: the only iptables that takes the
// xtables lock.
func legacyTools(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"iptables", "iptables-restore", "iptables-save", "ip6tables", "ip6tables-restore", "ip6tables-save"} {
		legacy := strings.Replace(name, "tables", "tables-legacy", 1)
		path, err := exec.LookPath(legacy)
		if err != nil {
			t.Fatalf("%s: %v (the xtables lock is iptables-legacy's)", legacy, err)
		}
		if err := os.Symlink(path, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
}

// TestHeldXtablesLock: another program holds the xtables lock (here
// flock(1), on a lock of the test's own through XTABLES_LOCKFILE, which
// iptables-legacy reads). ADD with the iptables backend waits the tools'
// own bound (-w 20) and no longer, fails with code 11 ("try again
// later") naming the lock and its holder, and leaves nothing of the
// attachment behind; once the lock is free, ADD maps the port. (The
// main plugin's ipMasq is off: ptp's go-iptables waits for the lock with
// a bare --wait, without a bound.)
func TestHeldXtablesLock(t *testing.T) {
	legacyTools(t)
	lockPath := filepath.Join(t.TempDir(), "xtables.lock")
	t.Setenv("XTABLES_LOCKFILE", lockPath)
	if err := os.WriteFile(lockPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("flock", "-o", lockPath, "sleep", "40")
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	release := func() { _ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL); _ = holder.Wait() }
	defer release()

	cl := lan(t)
	rt := nettest.NewRuntime(t, nettest.Net{Name: "xtlock", V4: "192.0.2.80/28", NoMasq: true, Extra: map[string]string{"backend": `"iptables"`}})
	before := nettest.Save(t, 4)
	start := time.Now()
	c, err := rt.Add(t, "c1", nettest.Mapping{HostPort: 6300, ContainerPort: srvPort})
	took := time.Since(start)
	t.Logf("ADD while flock(1) holds the xtables lock: %s after %s", err, took.Round(time.Millisecond))
	if err == nil {
		_ = rt.Del(c)
		t.Fatal("ADD while the xtables lock is held succeeded")
	}
	if code := nettest.Code(err); code != 11 || !strings.Contains(err.Error(), "the xtables lock "+lockPath+", held by pid") || !strings.Contains(err.Error(), "(flock)") {
		t.Errorf("ADD: code %d, %v; want 11 naming the lock and flock(1) holding it", code, err)
	}
	if bound := 25 * time.Second; took > bound {
		t.Errorf("ADD waited %s, want at most %s (the tools' -w 20 and a margin)", took, bound)
	}
	if after := nettest.Save(t, 4); after != before {
		t.Errorf("the failed ADD left rules behind:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	release()
	c, err = rt.Add(t, "c2", nettest.Mapping{HostPort: 6300, ContainerPort: srvPort})
	if err != nil {
		t.Fatalf("ADD once the lock is free: %v", err)
	}
	nettest.Serve(t, c.NS, "c2", srvPort)
	if got, err := nettest.Dial(cl.NS, "tcp", addr(nodeIP, 6300)); err != nil || !strings.HasPrefix(got, "c2 sees ") {
		t.Errorf("the host port: %q, %v", got, err)
	}
	if err := rt.Del(c); err != nil {
		t.Error(err)
	}
}
