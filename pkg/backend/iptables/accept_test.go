package iptables

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/pkg/xt/xttest"
)

func TestForwardApplyRemove(t *testing.T) {
	a, _, _ := syncPlans("192.0.2.2")
	k := &fakeKernel{}
	fw := &Accept{Family: plan.IPv4, Kernel: k, Lock: func() (func(), error) { return func() {}, nil }}
	if err := fw.Apply(a); err != nil {
		t.Fatal(err)
	}
	chain := AcceptChainName(a.Owner)
	want := "*filter\n" +
		"-C FORWARD -j CNI-HOSTPORT-FWD\n" +
		"-N " + chain + "\n" +
		"-A " + chain + " -p tcp -m conntrack --ctstate DNAT --ctorigdstport 8080 --ctreplsrc 192.0.2.2 --ctreplsrcport 80 -j ACCEPT\n" +
		"-A " + chain + " -p udp -m conntrack --ctstate DNAT --ctorigdstport 8053 --ctorigdst 198.51.100.1 --ctreplsrc 192.0.2.2 --ctreplsrcport 53 -j ACCEPT\n" +
		"-A CNI-HOSTPORT-FWD -m comment --comment \"dnat name: \\\"net1\\\" id: \\\"a\\\"\" -j " + chain + "\n" +
		"COMMIT\n"
	if len(k.restores) != 1 || k.restores[0] != want {
		t.Errorf("fast path:\n%s\nwant:\n%s", strings.Join(k.restores, "---\n"), want)
	}

	// ADD again: the fast path fails (the chain exists), and the slow
	// path, a pass's repair of the one attachment, leaves the chain with
	// exactly its rules and one jump to it, whatever was there before.
	m := xttest.New(xt.NativeExprs)
	mk := m.Kernel(FilterTable)
	fw.Kernel = mk
	if err := fw.Apply(a); err != nil {
		t.Fatal(err)
	}
	more := filterPayload()
	more.rule("-A", xt.Rule{Table: FilterTable, Chain: chain, Proto: plan.TCP, Jump: "ACCEPT"})
	more.rule("-A", forwardEntry(a.Owner))
	if err := mk.Restore(more.bytes()); err != nil {
		t.Fatal(err)
	}
	if err := fw.Apply(a); err != nil {
		t.Fatalf("ADD again: %v", err)
	}
	if err := fw.Check(a); err != nil {
		t.Errorf("CHECK after ADD again: %v", err)
	}

	// DEL without the jump: the second payload only declares and deletes
	// the chain. No prevResult is needed.
	k = &fakeKernel{failOn: "-D CNI-HOSTPORT-FWD"}
	fw.Kernel = k
	bare := plan.Build(plan.Request{Owner: a.Owner}, plan.IPv4, nil)
	if err := fw.Remove(bare); err != nil {
		t.Fatal(err)
	}
	if len(k.restores) != 2 || k.restores[1] != "*filter\n:"+chain+" - [0:0]\n-X "+chain+"\nCOMMIT\n" {
		t.Errorf("remove: %q", k.restores)
	}
}

func TestForwardSync(t *testing.T) {
	a, bb, _ := syncPlans("192.0.2.2")
	ca, cb := AcceptChainName(a.Owner), AcceptChainName(bb.Owner)
	k := &fakeKernel{lines: []string{
		"-P FORWARD DROP",
		"-N CNI-HOSTPORT-FWD",
		"-N DOCKER-USER", // another's chain: never an orphan of ours
		"-N " + ca,
		"-N " + cb,
		"-A FORWARD -j DOCKER-USER",
		"-A FORWARD -j CNI-HOSTPORT-FWD",
		"-A DOCKER-USER -j RETURN",
		`-A CNI-HOSTPORT-FWD -m comment --comment "dnat name: \"net1\" id: \"a\"" -j ` + ca,
		`-A CNI-HOSTPORT-FWD -m comment --comment "dnat name: \"net1\" id: \"b\"" -j ` + cb,
		"-A " + ca + " -p tcp -m conntrack --ctstate DNAT --ctreplsrc 192.0.2.2/32 --ctorigdstport 8080 --ctreplsrcport 80 -j ACCEPT",
		"-A " + ca + " -p udp -m conntrack --ctstate DNAT --ctorigdst 198.51.100.1/32 --ctreplsrc 192.0.2.2/32 --ctorigdstport 8053 --ctreplsrcport 53 -j ACCEPT",
	}}
	fw := &Accept{Family: plan.IPv4, Kernel: k}
	rep, err := fw.Sync([]*plan.Plan{a}, converge.Options{Prune: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[0].State != converge.OK || len(rep.Shared) != 0 {
		t.Errorf("a: %+v shared %q, want ok (rules in iptables' own order and spelling)", rep.Results, rep.Shared)
	}
	if len(rep.Orphans) != 1 || rep.Orphans[0].ContainerID != "b" || !rep.Orphans[0].Pruned {
		t.Fatalf("orphans %+v, want b pruned (and no other chain of the table)", rep.Orphans)
	}
	if len(k.restores) != 1 || !strings.Contains(k.restores[0], "-X "+cb+"\n") || strings.Contains(k.restores[0], ca) {
		t.Errorf("prune payload %q", k.restores)
	}

	// A wrong container address is repaired.
	a9, _, _ := syncPlans("192.0.2.9")
	k.restores = nil
	rep, _ = fw.Sync([]*plan.Plan{a9}, converge.Options{})
	if rep.Results[0].State != converge.Repaired || len(k.restores) != 1 || !strings.Contains(k.restores[0], "--ctreplsrc 192.0.2.9") {
		t.Errorf("results %+v restores %q", rep.Results, k.restores)
	}
}

// CHECK judges the filter table as a pass does: the shared chain and its
// jump, the attachment's chain holding exactly its accept rules, and its
// one jump; each broken by hand is named, and what a pass repairs passes.
func TestForwardCheck(t *testing.T) {
	a, _, _ := syncPlans("192.0.2.2")
	m := xttest.New(xt.NativeExprs)
	k := m.Kernel(FilterTable)
	fw := &Accept{Family: plan.IPv4, Kernel: k, Lock: func() (func(), error) { return func() {}, nil }}
	if err := fw.Check(a); err == nil || !strings.Contains(err.Error(), "chain CNI-HOSTPORT-FWD or the jump to it from FORWARD missing") {
		t.Errorf("CHECK before ADD: %v", err)
	}
	if err := fw.Apply(a); err != nil {
		t.Fatal(err)
	}
	if err := fw.Check(a); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	// on a fresh node the fast path fails (no jump from FORWARD) and the
	// slow path writes the shared chain and jump in its one restore
	if m.Restores != 1 || m.Ensures != 0 {
		t.Errorf("ADD on a fresh node: %d restores, %d ensures, want 1 and none", m.Restores, m.Ensures)
	}
	chain := AcceptChainName(a.Owner)
	line := func(cmd string, r xt.Rule) []byte {
		pl := filterPayload()
		pl.rule(cmd, r)
		return pl.bytes()
	}
	shared := filterPayload()
	shared.rule("-D", forwardJump)
	shared.line("-F "+forwardChain, "")
	shared.line("-X "+forwardChain, "")
	for _, tt := range []struct {
		name    string
		payload []byte
		want    string
	}{
		{"the jump from FORWARD", line("-D", forwardJump), "chain CNI-HOSTPORT-FWD or the jump to it from FORWARD missing"},
		{"the shared chain", shared.bytes(), "chain CNI-HOSTPORT-FWD or the jump to it from FORWARD missing"},
		{"an accept rule", line("-D", acceptRules(a)[1]), "chain " + chain + ": "},
		{"a rule more", line("-A", xt.Rule{Table: FilterTable, Chain: chain, Proto: plan.TCP, Jump: "ACCEPT"}), "chain " + chain + ": "},
		{"a second jump", line("-A", forwardEntry(a.Owner)), "2 jumps to " + chain},
		{"the jump", line("-D", forwardEntry(a.Owner)), "0 jumps to " + chain},
	} {
		if err := k.Restore(tt.payload); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if err := fw.Check(a); err == nil || !strings.Contains(err.Error(), "forwardAccept: ") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("CHECK after %s changed: %v, want %q", tt.name, err, tt.want)
		}
		restores, ensures := m.Restores, m.Ensures
		if rep, err := fw.Sync([]*plan.Plan{a}, converge.Options{}); err != nil || !rep.Wrote {
			t.Fatalf("pass after %s: %+v, %v", tt.name, rep, err)
		}
		if err := fw.Check(a); err != nil {
			t.Errorf("CHECK after the pass's repair (%s): %v", tt.name, err)
		}
		if m.Restores != restores+1 || m.Ensures != ensures {
			t.Errorf("the pass's repair (%s): %d restores, %d ensures, want one restore", tt.name, m.Restores-restores, m.Ensures-ensures)
		}
	}
}

func TestForwardGC(t *testing.T) {
	a, bb, _ := syncPlans("192.0.2.2")
	ca, cb := AcceptChainName(a.Owner), AcceptChainName(bb.Owner)
	k := &fakeKernel{lines: []string{
		"-N CNI-HOSTPORT-FWD", "-N " + ca, "-N " + cb, "-A FORWARD -j CNI-HOSTPORT-FWD",
		`-A CNI-HOSTPORT-FWD -m comment --comment "dnat name: \"net1\" id: \"a\"" -j ` + ca,
		`-A CNI-HOSTPORT-FWD -m comment --comment "dnat name: \"net1\" id: \"b\"" -j ` + cb,
	}}
	fw := &Accept{Family: plan.IPv4, Kernel: k, Lock: func() (func(), error) { return func() {}, nil }}
	if err := fw.GC("net1", []plan.Owner{a.Owner}); err != nil {
		t.Fatal(err)
	}
	if len(k.restores) != 1 || !strings.Contains(k.restores[0], "-X "+cb+"\n") || strings.Contains(k.restores[0], ca) {
		t.Errorf("GC: %q", k.restores)
	}
	k.restores = nil
	if err := fw.GC("other", nil); err != nil || len(k.restores) != 0 {
		t.Errorf("GC of another network: %v %q", err, k.restores)
	}
}

// What the registry opens and asks of the real kernel's constructors:
// the tool each family runs, and a missing one named.
func TestConstructorsNameTheirTool(t *testing.T) {
	if RestoreCommand(plan.IPv4) != "iptables-restore" || RestoreCommand(plan.IPv6) != "ip6tables-restore" {
		t.Errorf("RestoreCommand: %s, %s", RestoreCommand(plan.IPv4), RestoreCommand(plan.IPv6))
	}
	t.Setenv("PATH", t.TempDir())
	for _, f := range plan.Families {
		if _, err := New(f); !errors.Is(err, exec.ErrNotFound) || !strings.Contains(err.Error(), RestoreCommand(f)) {
			t.Errorf("New(%s) without its tool: %v", f, err)
		}
		if _, err := NewAccept(f); !errors.Is(err, exec.ErrNotFound) {
			t.Errorf("NewAccept(%s) without its tool: %v", f, err)
		}
	}
}

// forwardAccept's Ready asks the restore tool to test an empty filter
// payload; the layer forwards no host port of its own.
func TestAcceptReadyAndMappings(t *testing.T) {
	k := &fakeKernel{}
	fw := &Accept{Family: plan.IPv4, Kernel: k}
	if err := fw.Ready(nil); err != nil {
		t.Errorf("Ready: %v", err)
	}
	if ms, err := fw.Mappings(); ms != nil || err != nil {
		t.Errorf("Mappings = %v, %v", ms, err)
	}
	re := &xt.RestoreError{Err: exec.ErrNotFound, Output: " line 2 failed\n"}
	if !errors.Is(re, exec.ErrNotFound) || re.Error() != "executable file not found in $PATH: line 2 failed" {
		t.Errorf("RestoreError: %q", re.Error())
	}
}
