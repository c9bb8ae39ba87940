package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/agent"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/nfevents"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// cached caches an attachment of net1 mapping 8080 → 80, as libcni
// would after ADD.
func cached(t *testing.T, dir, id string) {
	t.Helper()
	conflist := `{"cniVersion":"1.0.0","name":"net1","plugins":[{"type":"ptp"},{"type":"portmap","capabilities":{"portMappings":true},"backend":"nftables"}]}`
	e := cnicache.Entry{Network: "net1", ContainerID: id, IfName: "eth0", Conflist: []byte(conflist),
		CapabilityArgs: map[string]any{"portMappings": []any{map[string]any{"hostPort": 8080, "containerPort": 80}}},
		Result: map[string]any{"cniVersion": "1.0.0",
			"interfaces": []any{map[string]any{"name": "eth0", "sandbox": "/run/netns/" + id}},
			"ips":        []any{map[string]any{"address": "192.0.2.2/24", "interface": 0}}}}
	if err := cnicache.Write(dir, e); err != nil {
		t.Fatal(err)
	}
}

// A pass in process on a fake host: the cache's attachment reaches its
// backend's sync, the report goes to stdout (text or JSON), and the exit
// status says whether anything could not be repaired.
func TestSyncPass(t *testing.T) {
	dir := t.TempDir()
	cached(t, dir, "c1")
	for _, tt := range []struct {
		name   string
		args   []string
		answer func(string, plan.Family, []*plan.Plan, converge.Options) *converge.Report
		fail   error
		code   int
		out    string // in stdout
		err    string // in stderr
		calls  string // in the fake's calls
	}{
		{name: "one pass", args: []string{"--cache-dir", dir}, out: "net1 c1 eth0: ok\nsync: 1 attachments: 1 ok",
			calls: "sync nftables ipv4 [c1] prune=false dry=false"},
		{name: "dry run", args: []string{"--cache-dir", dir, "--dry-run", "--prune"}, out: "dry run: nothing changed",
			calls: "sync nftables ipv4 [c1] prune=true dry=true"},
		{name: "json", args: []string{"--cache-dir", dir, "--json"}, out: `"containerID": "c1"`},
		{name: "a repair failed", args: []string{"--cache-dir", dir}, code: 1,
			answer: func(name string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report {
				r := converge.NewReport(len(want))
				if name == "nftables" && len(want) == 1 {
					r.Results[0] = converge.Result{State: converge.Error, What: "no table"}
				}
				return r
			}, out: "error"},
		{name: "the backend fails", args: []string{"--cache-dir", dir}, fail: errors.New("netlink: permission denied"), code: 1,
			err: "permission denied"},
		{name: "network filter", args: []string{"--cache-dir", dir, "--network", "net2"}, calls: "sync nftables ipv4 [] prune=false dry=false"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, fh, out, errb := fakeProgram()
			fh.SyncAnswer, fh.FailAll = tt.answer, tt.fail
			fh.Localnet["veth-192.0.2.2"] = true // as the ADD left it
			code := p.Run(append([]string{"sync"}, tt.args...))
			if code != tt.code || !strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.err) ||
				!strings.Contains(fh.Calls(), tt.calls) {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s\ncalls:\n%s\nwant %q, %q and %q in them",
					code, tt.code, out, errb, fh.Calls(), tt.out, tt.err, tt.calls)
			}
			if strings.Contains(strings.Join(tt.args, " "), "--json") {
				var rep agent.Report
				if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Attachments) != 1 {
					t.Errorf("--json: %v, report %+v", err, rep)
				}
			}
		})
	}
}

// --root chroots before the host is opened; a chroot that fails ends
// the command with 1 and nothing synced.
func TestSyncRoot(t *testing.T) {
	dir := t.TempDir()
	for _, fail := range []error{nil, errors.New("chroot /host: operation not permitted")} {
		p, fh, _, errb := fakeProgram()
		var order []string
		p.Chroot = func(d string) error { order = append(order, "chroot "+d); return fail }
		open := p.Host
		p.Host = func(log io.Writer) *host.Host { order = append(order, "host"); return open(log) }
		code := p.Run([]string{"sync", "--root", "/host", "--cache-dir", dir})
		want, wantCode := "chroot /host host", 0
		if fail != nil {
			want, wantCode = "chroot /host", 1
		}
		if got := strings.Join(order, " "); got != want || code != wantCode || (fail != nil && (!strings.Contains(errb.String(), "not permitted") || fh.Calls() != "")) {
			t.Errorf("chroot failing %v: order %q exit %d, want %q %d; stderr %s; calls %q", fail, got, code, want, wantCode, errb, fh.Calls())
		}
	}
}

// The watcher in process: a pass at the start, one on the interval, a
// clean stop when its context ends; without nf_tables events it says
// so and goes on with the timer; with an observer it serves metrics.
func TestSyncWatch(t *testing.T) {
	dir := t.TempDir()
	cached(t, dir, "c1")
	p, fh, out, _ := fakeProgram()
	ctx, cancel := context.WithCancel(context.Background())
	p.Context = ctx
	p.Events = func() (*nfevents.Subscription, error) { return nil, errors.New("no netlink here") }
	obs := &fakeObserver{passes: make(chan agent.PassInfo, 10)}
	p.Metrics = func(time.Duration) Observer { return obs }
	done := make(chan int)
	go func() {
		done <- p.Run([]string{"sync", "--watch", "--cache-dir", dir, "--interval", "50ms", "--metrics-addr", "127.0.0.1:0", "--log-format", "json"})
	}()
	for i := 0; i < 2; i++ {
		select {
		case pi := <-obs.passes:
			if pi.Err != nil {
				t.Errorf("pass %d: %v", i, pi.Err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no pass %d in 10 s; log:\n%s", i, out)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d, want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not stop with its context")
	}
	for _, want := range []string{`"msg":"no nf_tables events; passes on the interval only"`, `"msg":"stopping"`, `"addr":"fake:9765"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if n := strings.Count(fh.Calls(), "sync nftables ipv4 [c1]"); n < 2 {
		t.Errorf("%d passes synced c1, want 2 or more:\n%s", n, fh.Calls())
	}
}

type fakeObserver struct{ passes chan agent.PassInfo }

func (o *fakeObserver) Pass(pi agent.PassInfo) {
	select {
	case o.passes <- pi:
	default: // the test has seen enough
	}
}
func (o *fakeObserver) Event()  {}
func (o *fakeObserver) Reload() {}
func (o *fakeObserver) Serve(context.Context, string, *slog.Logger) (net.Addr, error) {
	return fakeAddr{}, nil
}

type fakeAddr struct{}

func (fakeAddr) Network() string { return "tcp" }
func (fakeAddr) String() string  { return "fake:9765" }

func TestSyncUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--bogus"}, {"extra"}, {"--watch", "--json"}, {"--watch", "--dry-run"},
		{"--interval", "5s"}, {"--watch", "--interval", "0s"}, {"--watch", "--log-format", "xml"},
		{"--watch", "--metrics-addr", ":9765"}, // a build without metrics
		{"--bpf-pin-dir", "relative/pins"}, {"--bpf-pin-dir", "/sys/fs/bpf/../pins"}, {"--bpf-pin-dir", ""},
	} {
		p, fh, _, errb := fakeProgram()
		p.Metrics = nil
		if code := p.Run(append([]string{"sync"}, args...)); code != 2 || errb.Len() == 0 || fh.Calls() != "" {
			t.Errorf("sync %q: exit %d, stderr %q, calls %q; want 2, a reason and nothing done", args, code, errb, fh.Calls())
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
