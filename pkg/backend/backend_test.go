package backend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// recorder is a Backend that logs each call as "name verb".
type recorder struct {
	name string
	log  *[]string
	fail map[string]error // by verb
}

func (r recorder) do(verb string) error {
	*r.log = append(*r.log, r.name+" "+verb)
	return r.fail[verb]
}
func (r recorder) Apply(*plan.Plan) error        { return r.do("apply") }
func (r recorder) Remove(*plan.Plan) error       { return r.do("remove") }
func (r recorder) Check(*plan.Plan) error        { return r.do("check") }
func (r recorder) GC(string, []plan.Owner) error { return r.do("gc") }
func (r recorder) Ready(*plan.Plan) error        { return r.do("ready") }
func (r recorder) Mappings() ([]plan.Installed, error) {
	return nil, r.do("mappings")
}
func (r recorder) Sync(want []*plan.Plan, _ converge.Options) (*converge.Report, error) {
	return converge.NewReport(len(want)), r.do("sync")
}

func TestStack(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name string
		fail map[string]map[string]error // backend -> verb -> error
		run  func(Stack) error
		want string
		err  bool
	}{
		{"apply: base, then layers", nil, func(s Stack) error { return s.Apply(&plan.Plan{}) },
			"base apply, l1 apply, l2 apply", false},
		{"apply: a failing layer undoes this family", map[string]map[string]error{"l2": {"apply": boom}},
			func(s Stack) error { return s.Apply(&plan.Plan{}) },
			"base apply, l1 apply, l2 apply, l1 remove, base remove", true},
		{"apply: a failing base applies no layer", map[string]map[string]error{"base": {"apply": boom}},
			func(s Stack) error { return s.Apply(&plan.Plan{}) }, "base apply", true},
		{"remove: layers first, goes on after errors", map[string]map[string]error{"l1": {"remove": boom}},
			func(s Stack) error { return s.Remove(&plan.Plan{}) }, "l1 remove, l2 remove, base remove", true},
		{"check: stops at the first", map[string]map[string]error{"l1": {"check": boom}},
			func(s Stack) error { return s.Check(&plan.Plan{}) }, "base check, l1 check", true},
		{"gc: every one", map[string]map[string]error{"base": {"gc": boom}},
			func(s Stack) error { return s.GC("net1", nil) }, "base gc, l1 gc, l2 gc", true},
		{"ready: base and layers", nil, func(s Stack) error { return s.Ready(&plan.Plan{}) },
			"base ready, l1 ready, l2 ready", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log []string
			mk := func(n string) recorder { return recorder{n, &log, tt.fail[n]} }
			err := tt.run(Stack{Base: mk("base"), Layers: []Backend{mk("l1"), mk("l2")}})
			if got := strings.Join(log, ", "); got != tt.want {
				t.Errorf("calls %q, want %q", got, tt.want)
			}
			if (err != nil) != tt.err || (err != nil && !errors.Is(err, boom)) {
				t.Errorf("error %v, want failure %v", err, tt.err)
			}
		})
	}
}

func TestRegistry(t *testing.T) {
	for _, name := range []Name{IPTables, NFTables} {
		k, ok := Lookup(name)
		if !ok || k.Name != name || k.Open == nil || k.BadConditionToken == nil {
			t.Errorf("Lookup(%q) = %+v, %v", name, k, ok)
		}
	}
	if _, ok := Lookup("ipvs"); ok {
		t.Error("Lookup found an unregistered backend")
	}
	l := Layers[0]
	if l.Name != "forwardAccept" || l.Wants(&plan.Request{}) || !l.Wants(&plan.Request{ForwardAccept: true}) {
		t.Errorf("forwardAccept layer: %+v", l)
	}
}

// A host without iptables has no FORWARD chain of it that could drop
// anything: the forwardAccept layer opens as Nothing, whatever backend.
func TestAcceptWithoutIPTablesIsNothing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, f := range plan.Families {
		b, err := Layers[0].Open(f, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, ok := b.(inFamily); ok {
			t.Errorf("%s: a real accept layer opened without iptables on PATH", f)
		}
		if _, ok := b.(Nothing); !ok {
			t.Errorf("%s: opened %T, want Nothing", f, b)
		}
		r, err := b.Sync(make([]*plan.Plan, 2), converge.Options{})
		if err != nil || len(r.Results) != 2 || r.Results[0].State != converge.OK {
			t.Errorf("%s: Sync = %+v, %v; want two ok results", f, r, err)
		}
	}
	// The iptables backend itself reports its missing tool.
	k, _ := Lookup(IPTables)
	if _, err := k.Open(plan.IPv4, nil); err == nil || !strings.Contains(fmt.Sprint(err), "iptables-restore") {
		t.Errorf("iptables without its tool: %v", err)
	}
}

// The default backend is the first kind installed, as upstream chooses:
// iptables where its tools are, else nftables.
func TestDefault(t *testing.T) {
	kind := func(name Name, installed bool) Kind {
		return Kind{Name: name, Installed: func() bool { return installed }}
	}
	for _, tt := range []struct {
		kinds []Kind
		want  Name
	}{
		{[]Kind{kind(IPTables, true), kind(NFTables, true)}, IPTables},
		{[]Kind{kind(IPTables, false), kind(NFTables, true)}, NFTables},
		{[]Kind{kind(IPTables, false), kind(NFTables, false)}, NFTables},
		{nil, ""},
	} {
		if got := Default(tt.kinds); got != tt.want {
			t.Errorf("Default(%v) = %q, want %q", tt.kinds, got, tt.want)
		}
	}
}

// Normalize gives each site one spelling: the socket path's default pin
// directory named by its path is the default site "".
func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{"": "", "/sys/fs/bpf/cni-portmap": "", "/sys/fs/bpf/other": "/sys/fs/bpf/other"} {
		req := &plan.Request{Socket: plan.Socket{PinDir: in}}
		Normalize(req)
		if req.Socket.PinDir != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, req.Socket.PinDir, want)
		}
	}
}

// skeletal is a recorder with shared objects.
type skeletal struct {
	recorder
	missing string
	some    bool
}

func (s skeletal) Skeleton(*plan.Plan) (string, bool, error) {
	return s.missing, s.some, s.do("skeleton")
}

// retiring is a recorder with node-wide objects to retire.
type retiring struct{ recorder }

func (r retiring) Retire() (string, error) { return "programs", r.do("retire") }

// Every error of an opened backend names its family, once; Retire and
// Skeleton reach the backend that has them and answer nothing for one
// that has not.
func TestInFamily(t *testing.T) {
	boom := errors.New("boom")
	var log []string
	fail := map[string]error{}
	for _, v := range []string{"apply", "remove", "check", "gc", "ready", "mappings", "sync", "skeleton", "retire"} {
		fail[v] = boom
	}
	b, err := opened(plan.IPv6, skeletal{recorder{"sk", &log, fail}, "jump in PREROUTING", true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &plan.Plan{}
	_, merr := b.Mappings()
	_, serr := b.Sync(nil, converge.Options{})
	x := b.(inFamily)
	missing, some, kerr := x.Skeleton(p)
	for i, err := range []error{b.Apply(p), b.Remove(p), b.Check(p), b.GC("n", nil), b.Ready(p), merr, serr, kerr} {
		if err == nil || err.Error() != "ipv6: boom" || !errors.Is(err, boom) {
			t.Errorf("call %d: %v, want \"ipv6: boom\"", i, err)
		}
	}
	if missing != "jump in PREROUTING" || !some {
		t.Errorf("Skeleton = %q, %v", missing, some)
	}
	if what, err := x.Retire(); what != "" || err != nil {
		t.Errorf("Retire of a backend without node-wide objects = %q, %v", what, err)
	}
	r, _ := opened(plan.IPv4, retiring{recorder{"r", &log, nil}}, nil)
	if what, err := r.(inFamily).Retire(); what != "programs" || err != nil {
		t.Errorf("Retire = %q, %v", what, err)
	}
	if m, some, err := r.(inFamily).Skeleton(p); m != "" || some || err != nil {
		t.Errorf("Skeleton of a backend without shared objects = %q, %v, %v", m, some, err)
	}
	if b, err := opened[recorder](plan.IPv4, recorder{}, boom); b != nil || err == nil || err.Error() != "ipv4: boom" {
		t.Errorf("opened with an error = %v, %v; want nil and \"ipv4: boom\"", b, err)
	}
}

// ADD asks the ReadyFirst layers alone, before anything; Skeleton takes
// the first missing object and whether any has some.
func TestStackReadyFirstAndSkeleton(t *testing.T) {
	boom := errors.New("no cgroup2")
	var log []string
	base := skeletal{recorder{"base", &log, nil}, "", true}
	l1 := skeletal{recorder{"l1", &log, map[string]error{"ready": boom}}, "map", false}
	l2 := skeletal{recorder{"l2", &log, nil}, "pins", true}
	s := Stack{Base: base, Layers: []Backend{l1, l2, recorder{"plain", &log, nil}}, ReadyFirst: []Backend{l1}}
	if err := s.LayersReady(&plan.Plan{}); !errors.Is(err, boom) || strings.Join(log, ",") != "l1 ready" {
		t.Errorf("LayersReady: %v, calls %q", err, log)
	}
	log = nil
	missing, some, err := s.Skeleton(&plan.Plan{})
	if missing != "map" || !some || err != nil || strings.Join(log, ",") != "base skeleton,l1 skeleton,l2 skeleton" {
		t.Errorf("Skeleton = %q, %v, %v; calls %q", missing, some, err, log)
	}
	bad := Stack{Base: skeletal{recorder{"base", &log, map[string]error{"skeleton": boom}}, "", false}}
	if _, _, err := bad.Skeleton(&plan.Plan{}); !errors.Is(err, boom) {
		t.Errorf("Skeleton of a failing read: %v", err)
	}
}

// The registry's rows: the names in errors, the socket layer found by
// name with what the host asks of it, and the backends' installed checks
// (iptables by its tool on PATH, nftables always: netlink).
func TestRegistryRows(t *testing.T) {
	if got := Choices(); got != `"iptables" or "nftables"` {
		t.Errorf("Choices() = %s", got)
	}
	l, ok := LayerNamed("localhost")
	if !ok || l.Site == nil || l.Normalize == nil || l.SiteReady == nil || !l.ReadyFirst {
		t.Fatalf("LayerNamed(localhost) = %+v, %v", l, ok)
	}
	if _, ok := LayerNamed("nothing"); ok {
		t.Error("LayerNamed found an unregistered layer")
	}
	req := &plan.Request{Localhost: plan.LocalhostSocket, Socket: plan.Socket{PinDir: "/run/pins"}}
	if !l.Wants(req) || l.SiteOf(req) != "/run/pins" || l.SiteOf(nil) != "" || Layers[0].SiteOf(req) != "" {
		t.Errorf("sites: wants %v, %q %q %q", l.Wants(req), l.SiteOf(req), l.SiteOf(nil), Layers[0].SiteOf(req))
	}
	// A pin directory on no bpf filesystem: the site cannot be served.
	if err := l.SiteReady(&plan.Request{Socket: plan.Socket{PinDir: t.TempDir(), CgroupPath: t.TempDir()}}); err == nil {
		t.Error("SiteReady of a temporary directory: nil, want what the host lacks")
	}
	ipt, _ := Lookup(IPTables)
	nft, _ := Lookup(NFTables)
	t.Setenv("PATH", t.TempDir())
	if ipt.Installed() || !nft.Installed() || Default(Kinds) != NFTables {
		t.Errorf("without iptables on PATH: iptables installed %v, nftables %v, default %q", ipt.Installed(), nft.Installed(), Default(Kinds))
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "iptables-restore"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	if !ipt.Installed() || Default(Kinds) != IPTables {
		t.Errorf("with iptables-restore on PATH: installed %v, default %q", ipt.Installed(), Default(Kinds))
	}
}
