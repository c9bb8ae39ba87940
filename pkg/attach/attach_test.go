package attach

import (
	"errors"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
	"github.com/portmap-dev/portmap/test/fixture"
)

const prevV4 = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c"}],
  "ips":[{"address":"192.0.2.2/24","interface":0}]}`

// Load finishes what Parse returns for the node: the owner, the node's
// default backend, "auto" resolved by what the node serves, and one plan
// per family the container has an address of and mappings for.
func TestLoad(t *testing.T) {
	m := `[{"hostPort":8080,"containerPort":80},{"hostPort":8053,"containerPort":53,"protocol":"udp","hostIP":"2001:db8::1"}]`
	for _, tt := range []struct {
		name      string
		extra     map[string]string
		ready     error // what the node says of the socket path
		localhost plan.Localhost
		backend   backend.Name
		families  []plan.Family
	}{
		{name: "defaults", extra: map[string]string{"prevResult": prevV4}, localhost: plan.LocalhostNAT,
			backend: backend.NFTables, families: []plan.Family{plan.IPv4}},
		{name: "auto where the node serves the socket path", extra: map[string]string{"prevResult": prevV4, "localhost": `"auto"`},
			localhost: plan.LocalhostSocket, backend: backend.NFTables, families: []plan.Family{plan.IPv4}},
		{name: "auto where it cannot", extra: map[string]string{"prevResult": prevV4, "localhost": `"auto"`}, ready: errors.New("no cgroup2"),
			localhost: plan.LocalhostNAT, backend: backend.NFTables, families: []plan.Family{plan.IPv4}},
		{name: "backend named", extra: map[string]string{"prevResult": prevV4, "backend": `"iptables"`},
			localhost: plan.LocalhostNAT, backend: backend.IPTables, families: []plan.Family{plan.IPv4}},
		{name: "no prevResult: no plans", localhost: plan.LocalhostNAT, backend: backend.NFTables},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := fakehost.New()
			h.DefaultBackend = func() backend.Name { return backend.NFTables }
			h.SocketReady = func(*plan.Request) error { return tt.ready }
			extra := fixture.PortMappings(m)
			for k, v := range tt.extra {
				extra[k] = v
			}
			a, err := Load(h, fixture.Conf(t, extra), "c1", "eth0")
			if err != nil {
				t.Fatal(err)
			}
			if a.Request.Owner != fixture.Owner {
				t.Errorf("owner %+v, want %+v", a.Request.Owner, fixture.Owner)
			}
			if a.Request.Localhost != tt.localhost || a.Backend != tt.backend {
				t.Errorf("localhost %q backend %q, want %q %q", a.Request.Localhost, a.Backend, tt.localhost, tt.backend)
			}
			var fams []plan.Family
			for _, pl := range a.Plans {
				fams = append(fams, pl.Family)
				if pl.Owner != fixture.Owner || pl.Localhost != tt.localhost || pl.Mappings.Len() != 1 {
					t.Errorf("%s plan: owner %+v localhost %q %d mappings, want the attachment's and 1", pl.Family, pl.Owner, pl.Localhost, pl.Mappings.Len())
				}
			}
			if len(fams) != len(tt.families) || (len(fams) > 0 && fams[0] != tt.families[0]) {
				t.Errorf("plans of %v, want %v", fams, tt.families)
			}
			// Plan answers every family: the one built, else a plan of
			// the owner without the container's address (what DEL
			// removes by, its mappings what it flushes: the wildcard
			// in IPv4, the wildcard and 2001:db8::1 in IPv6).
			for _, f := range plan.Families {
				pl := a.Plan(f)
				if pl.Family != f || pl.Owner != fixture.Owner {
					t.Errorf("Plan(%s): family %s owner %+v", f, pl.Family, pl.Owner)
				}
				built := false
				for _, b := range a.Plans {
					built = built || b == pl
				}
				if built != (len(tt.families) > 0 && f == plan.IPv4) || (!built && pl.ContainerNet != nil) || pl.Mappings.Len() != map[plan.Family]int{plan.IPv4: 1, plan.IPv6: 2}[f] {
					t.Errorf("Plan(%s): the built plan %t, container %v, %d mappings", f, built, pl.ContainerNet, pl.Mappings.Len())
				}
			}
		})
	}
}

// Load refuses what Parse refuses, with Parse's error.
func TestLoadRefuses(t *testing.T) {
	h, _ := fakehost.New()
	_, err := Load(h, fixture.Conf(t, map[string]string{"localhost": `"maybe"`}), "c1", "eth0")
	if err == nil || err.Error() != `invalid localhost "maybe": must be "nat", "socket" or "auto"` {
		t.Fatalf("err %v, want the invalid localhost", err)
	}
}
