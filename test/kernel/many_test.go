package kernel

import (
	"fmt"
	"io"
	"strings"
	"testing"

	be "github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/nettest"
)

// manyPorts is one container with m TCP mappings 20000+i -> 80: no two
// of them make a run, so every mapping is rendered on its own.
func manyPorts(id string, m int) *plan.Plan {
	ports := make([]int, m)
	for i := range ports {
		ports[i] = 20000 + i
	}
	return mkPlan("net1", id, "192.0.2.2/24", ports...)
}

// TestTenThousandMappings drives every verb of both backends with one
// container holding 10,000 mappings: nothing the backends send may
// outgrow the socket's limits (netlink messages, element gets, restore
// payloads), and each verb's cost stays linear.
func TestTenThousandMappings(t *testing.T) {
	const m = 10000
	for _, kind := range be.Kinds {
		t.Run(string(kind.Name), func(t *testing.T) {
			nettest.ResetNAT(t)
			t.Cleanup(func() { nettest.ResetNAT(t) })
			b, err := kind.Open(plan.IPv4, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			p := manyPorts("big", m)
			if err := b.Apply(p); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if err := b.Check(p); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			got, err := b.Mappings()
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			if n := countOwned(got, "big"); n != m {
				t.Errorf("list shows %d mappings of the container, want %d", n, m)
			}
			rep, err := b.Sync([]*plan.Plan{p}, converge.Options{})
			if err != nil || rep.Wrote || rep.Results[0].State != converge.OK {
				t.Errorf("sync with nothing to repair: %+v, %v", rep, err)
			}
			nettest.ResetNAT(t)
			if err := b.Check(p); err == nil {
				t.Error("CHECK after the flush succeeded")
			}
			rep, err = b.Sync([]*plan.Plan{p}, converge.Options{})
			if err != nil || rep.Results[0].State != converge.Repaired {
				t.Fatalf("sync after the flush: %+v, %v", rep, err)
			}
			if err := b.Check(p); err != nil {
				t.Fatalf("CHECK after sync: %v", err)
			}
			// A second container takes the last port over; DEL of the
			// first leaves it alone.
			thief := mkPlan("net1", "thief", "192.0.2.3/24", 20000+m-1)
			if err := b.Apply(thief); err != nil {
				t.Fatalf("ADD of the thief: %v", err)
			}
			// nftables' map holds one owner per port, so CHECK of the
			// first sees the port gone; in iptables the thief's rules
			// shadow the first's, which stay in place.
			if err := b.Check(p); kind.Name == be.NFTables && (err == nil || !strings.Contains(err.Error(), fmt.Sprint(20000+m-1))) {
				t.Errorf("CHECK after the takeover = %v, want the port taken named", err)
			}
			if err := b.Remove(p); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := b.Remove(p); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
			if err := b.Check(thief); err != nil {
				t.Errorf("CHECK of the thief after DEL of the first: %v", err)
			}
			if err := b.GC("net1", nil); err != nil {
				t.Fatalf("GC: %v", err)
			}
			if got, err := b.Mappings(); err != nil || len(got) != 0 {
				t.Errorf("after GC: %d mappings left, %v", len(got), err)
			}
		})
	}
}

func countOwned(in []plan.Installed, id string) int {
	n := 0
	for _, i := range in {
		if i.Owner.ContainerID == id {
			n++
		}
	}
	return n
}
