package portmap

import (
	"bytes"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
)

// noListeners is the host's inventory with no process listening: the
// mappings are read from the backends as on a node.
type noListeners struct{ inventory.OnHost }

func (noListeners) Listener(string, string, int) (string, error) { return "", nil }

// TestConflictsOverMemory: hostPortConflict judged on the real backends
// over their kernels in memory, with an older attachment's mapping
// written by either backend and the newer one's ADD by either. Under
// "reject" an ADD whose port another attachment holds fails with code
// 101 naming it, and writes nothing: the kernels hold what they held and
// the port's connections still go to the older one. Another protocol,
// another specific host IP and the attachment's own mapping are no
// conflict; a wildcard over a specific host IP is. Under "replace" the
// newest ADD takes the port.
func TestConflictsOverMemory(t *testing.T) {
	const hostIP, otherIP = "198.51.100.1", "198.51.100.7"
	local := func(a net.IP) bool { return a.Equal(net.ParseIP(hostIP)) || a.Equal(net.ParseIP(otherIP)) }
	mapping := func(proto, ip string) string {
		m := `{"hostPort":8080,"containerPort":80,"protocol":"` + proto + `"`
		if ip != "" {
			m += `,"hostIP":"` + ip + `"`
		}
		return `{"portMappings":[` + m + `}]}`
	}
	tests := []struct {
		name      string
		oldIP     string // the older attachment's host IP, "" for any
		policy    string
		proto, ip string // the newer attachment's mapping
		own       bool   // the newer is the older one again
		conflict  bool
	}{
		{name: "reject another attachment", policy: "reject", proto: "tcp", conflict: true},
		{name: "reject a wildcard over a specific host IP", oldIP: otherIP, policy: "reject", proto: "tcp", conflict: true},
		{name: "another protocol", policy: "reject", proto: "udp"},
		{name: "another specific host IP", oldIP: otherIP, policy: "reject", proto: "tcp", ip: hostIP},
		{name: "its own mapping", policy: "reject", proto: "tcp", own: true},
		{name: "replace takes the port", policy: "replace", proto: "tcp"},
	}
	for _, oldBe := range []backend.Name{backend.NFTables, backend.IPTables} {
		for _, newBe := range []backend.Name{backend.NFTables, backend.IPTables} {
			for _, tt := range tests {
				t.Run(string(oldBe)+" then "+string(newBe)+"/"+tt.name, func(t *testing.T) {
					h, _ := fakehost.New()
					ks := fakehost.BackendsInMemory(h)
					p := &Plugin{Stdout: &bytes.Buffer{}, Host: h, Inventory: noListeners{inventory.OnHost{Host: h}}}
					// to is where be's kernel sends a connection to dst:8080
					to := func(be backend.Name, proto plan.Protocol, dst string) string {
						t.Helper()
						v, err := ks[be].Trace(plan.IPv4, plan.Packet{Protocol: proto, Src: net.ParseIP("203.0.113.9"), Dst: net.ParseIP(dst), Dport: 8080}, local)
						if err != nil {
							t.Fatal(err)
						}
						return v.DNAT
					}
					old := args(t, map[string]string{"backend": strconv.Quote(string(oldBe)), "prevResult": prevDual, "runtimeConfig": mapping("tcp", tt.oldIP)})
					old.ContainerID = "old"
					if err := p.Add(old); err != nil {
						t.Fatal(err)
					}
					dst := hostIP
					if tt.oldIP != "" {
						dst = tt.oldIP
					}
					if got := to(oldBe, plan.TCP, dst); got != "192.0.2.2:80" {
						t.Fatalf("the older attachment's port goes to %q", got)
					}
					prev := strings.ReplaceAll(strings.ReplaceAll(prevDual, "192.0.2.2", "192.0.2.3"), "2001:db8::2", "2001:db8::3")
					id := "c1"
					if tt.own {
						prev, id = prevDual, "old"
					}
					newer := args(t, map[string]string{"backend": strconv.Quote(string(newBe)), "prevResult": prev,
						"hostPortConflict": strconv.Quote(tt.policy), "runtimeConfig": mapping(tt.proto, tt.ip)})
					newer.ContainerID = id
					before := ks[backend.NFTables].Ruleset() + ks[backend.IPTables].Ruleset()

					err := p.Add(newer)
					if tt.conflict {
						want := `already mapped by network "net1" container "old" (` + string(oldBe) + ` backend, to 192.0.2.2:80)`
						if codeOf(err) != ErrHostPortInUse || !strings.Contains(err.Error(), want) {
							t.Fatalf("ADD: %v, want code %d with %q", err, ErrHostPortInUse, want)
						}
						if after := ks[backend.NFTables].Ruleset() + ks[backend.IPTables].Ruleset(); after != before {
							t.Errorf("a rejected ADD changed the kernels:\n%s\nwas:\n%s", after, before)
						}
						if got, got2 := to(oldBe, plan.TCP, dst), to(newBe, plan.TCP, dst); got != "192.0.2.2:80" || (newBe != oldBe && got2 != "") {
							t.Errorf("after a rejected ADD the port goes to %q (%s: %q), want the older attachment's alone", got, newBe, got2)
						}
						return
					}
					if err != nil {
						t.Fatalf("ADD: %v", err)
					}
					wantTo := "192.0.2.3:80"
					if tt.own {
						wantTo = "192.0.2.2:80"
					}
					newDst := hostIP
					if tt.ip == "" && tt.oldIP != "" {
						newDst = tt.oldIP
					}
					// the newer backend's rules send it there (where both
					// backends hold the port, which nat hook runs first is
					// the kernel's registration order: not judged)
					if got := to(newBe, plan.Protocol(tt.proto), newDst); got != wantTo {
						t.Errorf("the newer ADD's %s port goes to %q, want %s", tt.proto, got, wantTo)
					}
				})
			}
		}
	}
}
