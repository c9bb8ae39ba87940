package backend

import (
	"errors"
	"fmt"
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

// Canon gives each site one spelling: the socket path's default pin
// directory named by its path is the default site "".
func TestCanon(t *testing.T) {
	for in, want := range map[string]string{"": "", "/sys/fs/bpf/cni-portmap": "", "/sys/fs/bpf/other": "/sys/fs/bpf/other"} {
		req := &plan.Request{Socket: plan.Socket{PinDir: in}}
		Canon(req)
		if req.Socket.PinDir != want {
			t.Errorf("Canon(%q) = %q, want %q", in, req.Socket.PinDir, want)
		}
	}
}
