package cli

import "testing"

// Only usage errors: a pass would read (and could repair) the kernel
// state of the namespace the unit tests run in.
func TestSyncUsage(t *testing.T) {
	if got := (Program{Name: "portmap"}).syncMain([]string{"--bogus"}); got != 2 {
		t.Errorf("bad flag: exit %d, want 2", got)
	}
	if got := (Program{Name: "portmap"}).syncMain([]string{"extra"}); got != 2 {
		t.Errorf("extra argument: exit %d, want 2", got)
	}
	if got := (Program{Name: "portmap"}).syncMain([]string{"--watch", "--json"}); got != 2 {
		t.Errorf("--watch --json: exit %d, want 2", got)
	}
	for _, dir := range []string{"relative/pins", "/sys/fs/bpf/../pins", ""} {
		if got := (Program{Name: "portmap"}).syncMain([]string{"--bpf-pin-dir", dir}); got != 2 {
			t.Errorf("--bpf-pin-dir %q: exit %d, want 2", dir, got)
		}
	}
}

func TestPinDirSite(t *testing.T) {
	for _, c := range []struct{ dir, site string }{
		{"/run/pins", "/run/pins"},
		{"/sys/fs/bpf/cni-portmap", ""}, // the default site
	} {
		req, err := pinDirSite(c.dir)
		if err != nil || req.Socket.PinDir != c.site {
			t.Errorf("pinDirSite(%q) = %+v, %v; want pin dir %q", c.dir, req, err, c.site)
		}
	}
}
