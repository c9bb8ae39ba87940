package kernel

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/portmap-dev/portmap/pkg/agent"
	pmbackend "github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/backend/socket"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/plugins/portmap"
	"github.com/portmap-dev/portmap/test/fakehost"
	"github.com/portmap-dev/portmap/test/nettest"
)

// node is this namespace as a node whose plugin and agent share one
// host: both backends, the forwardAccept layer and the socket path's site
// (in a cgroup and bpf filesystem of the test's own; its entries are kept
// under a namespace cookie no socket has, as the socket tests judge the
// programs) on the real kernel, the sysctls, conntrack and ledger of a
// fake host. Its
// lock runs onLock once, the next time it is taken: the runtime's verb
// that lands between a pass's read of the cache and its lock.
type node struct {
	agent  *agent.Agent
	plugin *portmap.Plugin
	sock   socket.Site
	onLock func()
	fh     *fakehost.Host
}

// newNode empties this namespace's tables and returns it as a node.
func newNode(t *testing.T) *node {
	t.Helper()
	resetTables(t)
	h, fh := fakehost.New()
	cg := nettest.NewCgroupSite(t)
	cfg := plan.Socket{CgroupPath: cg.Cgroup, PinDir: cg.PinDir}
	site, err := socket.OpenSite(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = socket.Uninstall(cfg) })
	n := &node{sock: site, fh: fh}
	free := func() (func(), error) { return func() {}, nil }
	h.Lock = func() (func(), error) {
		if f := n.onLock; f != nil {
			n.onLock = nil
			f()
		}
		return func() {}, nil
	}
	for i, k := range h.Kinds {
		switch k.Name {
		case pmbackend.IPTables:
			h.Kinds[i].Open = func(f plan.Family, _ io.Writer) (pmbackend.Backend, error) {
				b, err := iptables.New(f)
				if err == nil {
					b.Lock = free
				}
				return b, err
			}
		case pmbackend.NFTables:
			h.Kinds[i].Open = func(f plan.Family, log io.Writer) (pmbackend.Backend, error) {
				b, err := nftables.New(f, log)
				if err == nil {
					b.Lock = free
				}
				return b, err
			}
		}
	}
	for i, l := range h.Layers {
		switch l.Name {
		case "forwardAccept":
			h.Layers[i].Open = func(f plan.Family, _ io.Writer, _ *plan.Request) (pmbackend.Backend, error) {
				a, err := iptables.NewAccept(f)
				if err == nil {
					a.Lock = free
				}
				return a, err
			}
		case "localhost":
			h.Layers[i].Open = func(f plan.Family, _ io.Writer, _ *plan.Request) (pmbackend.Backend, error) {
				return &socket.Layer{Family: f, Site: n.sock, Netns: func() (uint64, error) { return nodeNetns, nil }, Lock: free}, nil
			}
		}
	}
	h.SocketReady = func(*plan.Request) error { return nil }
	n.plugin = &portmap.Plugin{Host: h, Stdout: io.Discard, Inventory: inventory.OnHost{Host: h}}
	n.agent = &agent.Agent{Host: h}
	t.Cleanup(func() { resetTables(t) })
	return n
}

// resetTables empties the namespace's iptables nat and filter tables and
// deletes the nftables tables of both plugins.
func resetTables(t *testing.T) {
	t.Helper()
	nettest.ResetNAT(t)
	for _, tool := range []string{"iptables", "ip6tables"} {
		nettest.Run(t, tool, "-t", "filter", "-F")
		nettest.Run(t, tool, "-t", "filter", "-X")
	}
}

// flush is a firewall's flush of the IPv4 nat table and of the
// nftables tables.
func flush(t *testing.T) {
	t.Helper()
	if !nettest.Isolated() {
		t.Fatal("flush outside the test's own network namespace")
	}
	nettest.Run(t, "iptables", "-t", "nat", "-F")
	for _, fam := range []string{"ip", "ip6"} {
		_ = exec.Command("nft", "delete", "table", fam, nftables.Table).Run()
	}
}

var saveComment = regexp.MustCompile(`(?m)^#.*\n`)

// state is everything the node's kernel holds, for before/after diffs:
// the iptables tables as saved (their comments, which date the save,
// left out), the nftables tables as listed, the socket site.
func (n *node) state(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		for _, table := range []string{iptables.Table, iptables.FilterTable} {
			b.WriteString(saveComment.ReplaceAllString(nettest.Run(t, tool, "-t", table), ""))
		}
	}
	for _, fam := range []string{"ip", "ip6"} {
		out, _ := exec.Command("nft", "list", "table", fam, nftables.Table).Output()
		b.Write(out)
	}
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		st := n.socketState(t, f)
		fmt.Fprintf(&b, "socket entries: %v\nsocket owners: %v\n", st.Entries, st.Owners)
	}
	return b.String()
}

// forwards reports whether state sends a port to ip's port 80, in either
// backend's spelling.
func forwards(state, ip string) bool {
	return strings.Contains(state, ip+":80") || strings.Contains(state, ip+" . 80")
}

// holds reports whether the kernel holds anything of container id (by
// its chains' names, its socket entries' owner, its address).
func (n *node) holds(t *testing.T, id, ip string) bool {
	t.Helper()
	o := plan.Owner{Network: "net1", ContainerID: id, IfName: "eth0"}
	s := n.state(t)
	for _, frag := range []string{iptables.ChainName(o), nftables.ChainName(o), iptables.AcceptChainName(o)} {
		if strings.Contains(s, frag) {
			return true
		}
	}
	if forwards(s, ip) {
		return true
	}
	for _, f := range []plan.Family{plan.IPv4, plan.IPv6} {
		for _, ow := range n.socketState(t, f).Owners {
			if ow.ContainerID == id {
				return true
			}
		}
	}
	return false
}

// socketState is the socket site's entries and owners of family f.
func (n *node) socketState(t *testing.T, f plan.Family) *socket.State {
	t.Helper()
	st, err := n.sock.Read(nodeNetns, f)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// nodeNetns is the namespace cookie the node's socket layer writes under.
const nodeNetns = 4097

func jsonValue(t *testing.T, s string) any {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// attachment is one ADD of the runtime: its cache entry (written into
// the cache only when the runtime gets to it) and its plugin input.
type attachment struct {
	id, ip, netns string
	entry         cnicache.Entry
	stdin         []byte
}

func newAttachment(t *testing.T, id, ip, netns, extra string) *attachment {
	t.Helper()
	conflist := `{"cniVersion":"1.0.0","name":"net1","plugins":[{"type":"ptp"},
	  {"type":"portmap","capabilities":{"portMappings":true}` + extra + `}]}`
	a := &attachment{id: id, ip: ip, netns: netns, entry: cnicache.Entry{Network: "net1", ContainerID: id, IfName: "eth0",
		NetNS: netns, Conflist: []byte(conflist),
		CapabilityArgs: map[string]any{"portMappings": jsonValue(t, `[{"hostPort":8080,"containerPort":80}]`)},
		Result: map[string]any{"cniVersion": "1.0.0",
			"interfaces": []any{map[string]any{"name": "eth0", "sandbox": netns}},
			"ips":        []any{map[string]any{"address": ip + "/24", "interface": 0}}}}}
	// What libcni hands the plugin is what the cache rebuilds.
	dir := t.TempDir()
	a.cache(t, dir)
	atts, _, err := cnicache.Read(dir, "portmap")
	if err != nil || len(atts) != 1 {
		t.Fatalf("cache of %s: %v %v", id, atts, err)
	}
	a.stdin = atts[0].Stdin
	return a
}

func (a *attachment) cache(t *testing.T, dir string) {
	t.Helper()
	if err := cnicache.Write(dir, a.entry); err != nil {
		t.Fatal(err)
	}
}

func (a *attachment) args() *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: a.id, Netns: a.netns, IfName: "eth0", StdinData: a.stdin}
}

func (n *node) add(t *testing.T, a *attachment) {
	t.Helper()
	if err := n.plugin.Add(a.args()); err != nil {
		t.Fatalf("ADD %s: %v", a.id, err)
	}
}

func (n *node) del(t *testing.T, a *attachment) {
	t.Helper()
	if err := n.plugin.Del(a.args()); err != nil {
		t.Fatalf("DEL %s: %v", a.id, err)
	}
}

// The decision of issue #28 on the real kernel, for every backend and
// layer: a pass reads the cache, then the runtime's verb lands
// before the pass takes the host-wide lock (a pass is a read, a lock,
// then writes). The pass must bring back nothing of a container whose
// DEL has begun, take nothing of one whose ADD has returned but is not
// cached yet, write nothing from a cache entry older than the owner's
// last ADD, and leave a container whose namespace is gone.
func TestPassAfterARuntimeVerb(t *testing.T) {
	configs := []struct{ name, extra string }{
		{"iptables", `,"backend":"iptables"`},
		{"nftables", `,"backend":"nftables"`},
		{"iptables+forwardAccept", `,"backend":"iptables","forwardAccept":true`},
		{"nftables+forwardAccept", `,"backend":"nftables","forwardAccept":true`},
		{"iptables+socket", `,"backend":"iptables","localhost":"socket"`},
		{"nftables+socket", `,"backend":"nftables","localhost":"socket"`},
	}
	for _, cfg := range configs {
		for _, prune := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/prune=%t", cfg.name, prune), func(t *testing.T) {
				passAfterVerb(t, cfg.extra, prune)
			})
		}
	}
}

func passAfterVerb(t *testing.T, extra string, prune bool) {
	alive := filepath.Join(t.TempDir(), "netns")
	if err := os.MkdirAll(alive, 0o755); err != nil {
		t.Fatal(err)
	}
	nsPath := func(id string) string {
		p := filepath.Join(alive, id)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	o := agent.Options{Prune: prune}

	t.Run("DEL begun", func(t *testing.T) {
		n, dir := newNode(t), t.TempDir()
		o.CacheDir = dir
		c1 := newAttachment(t, "c1", "192.0.2.2", nsPath("c1"), extra)
		n.add(t, c1)
		c1.cache(t, dir)
		var afterDel string
		n.onLock = func() { n.del(t, c1); afterDel = n.state(t) }
		rep, err := n.agent.Sync(o)
		if err != nil {
			t.Fatal(err)
		}
		if got := n.state(t); got != afterDel || n.holds(t, "c1", c1.ip) {
			t.Errorf("the pass changed the node after DEL:\n%s\nwant:\n%s", got, afterDel)
		}
		if len(rep.Withheld) != 1 || rep.Withheld[0].Reason != agent.WithheldDeleted || rep.Summary.Repaired != 0 {
			t.Errorf("report %+v, want c1 withheld (deleted) and nothing repaired", rep)
		}
		// The runtime removed its entry: the next pass has nothing to say.
		os.Remove(filepath.Join(dir, "results", "net1-c1-eth0"))
		if rep, err := n.agent.Sync(o); err != nil || len(rep.Withheld)+len(rep.Orphans)+len(rep.Kept) != 0 || n.state(t) != afterDel {
			t.Errorf("next pass: %+v %v", rep, err)
		}
	})

	t.Run("ADD not cached yet", func(t *testing.T) {
		n, dir := newNode(t), t.TempDir()
		o.CacheDir = dir
		c2 := newAttachment(t, "c2", "192.0.2.3", nsPath("c2"), extra)
		var afterAdd string
		n.onLock = func() { n.add(t, c2); afterAdd = n.state(t) }
		for pass := range 3 { // the watcher's rule (seen twice) is not what keeps it
			rep, err := n.agent.Sync(o)
			if err != nil {
				t.Fatal(err)
			}
			if got := n.state(t); got != afterAdd || !n.holds(t, "c2", c2.ip) {
				t.Fatalf("pass %d took c2's objects:\n%s\nwant:\n%s", pass, got, afterAdd)
			}
			if len(rep.Orphans) != 0 || len(rep.Kept) == 0 {
				t.Errorf("pass %d: orphans %+v kept %+v, want c2's objects kept", pass, rep.Orphans, rep.Kept)
			}
		}
	})

	t.Run("re-ADD after the cache read", func(t *testing.T) {
		n, dir := newNode(t), t.TempDir()
		o.CacheDir = dir
		old := newAttachment(t, "c3", "192.0.2.4", nsPath("c3"), extra)
		n.add(t, old)
		old.cache(t, dir)
		renewed := newAttachment(t, "c3", "192.0.2.5", old.netns, extra)
		var afterReAdd string
		n.onLock = func() { n.del(t, old); n.add(t, renewed); afterReAdd = n.state(t) }
		rep, err := n.agent.Sync(o)
		if err != nil {
			t.Fatal(err)
		}
		if got := n.state(t); got != afterReAdd || forwards(got, old.ip) {
			t.Errorf("the pass wrote the old entry's address or took the new ADD's:\n%s\nwant:\n%s", got, afterReAdd)
		}
		if len(rep.Withheld) != 1 || rep.Withheld[0].Reason != agent.WithheldSuperseded || len(rep.Orphans) != 0 {
			t.Errorf("withheld %+v orphans %+v, want c3 superseded and no orphan", rep.Withheld, rep.Orphans)
		}
		// Once the runtime caches the new ADD, passes keep it as usual.
		renewed.cache(t, dir)
		flush(t)
		if rep, err := n.agent.Sync(o); err != nil || rep.Summary.Repaired != 1 || !forwards(n.state(t), renewed.ip) {
			t.Errorf("pass after the new entry: %+v %v, want c3 repaired at %s", rep, err, renewed.ip)
		}
	})

	t.Run("namespace gone", func(t *testing.T) {
		n, dir := newNode(t), t.TempDir()
		o.CacheDir = dir
		c4 := newAttachment(t, "c4", "192.0.2.6", nsPath("c4"), extra)
		n.add(t, c4)
		c4.cache(t, dir)
		os.Remove(c4.netns) // the runtime crashed; its container is gone
		rep, err := n.agent.Sync(o)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Withheld) != 1 || rep.Withheld[0].Reason != agent.WithheldGone {
			t.Errorf("withheld %+v, want c4 gone", rep.Withheld)
		}
		if prune == n.holds(t, "c4", c4.ip) {
			t.Errorf("prune=%t: c4's objects there: %t, want the opposite (%+v):\n%s", prune, !prune, rep, n.state(t))
		}
		recs, _, _ := n.fh.Ledger.Read()
		if _, ok := recs[plan.Owner{Network: "net1", ContainerID: "c4", IfName: "eth0"}]; !ok {
			t.Error("the record of a container still cached was forgotten")
		}
	})

	t.Run("ADDed before the ledger", func(t *testing.T) {
		n, dir := newNode(t), t.TempDir()
		o.CacheDir = dir
		legacy := newAttachment(t, "c5", "192.0.2.7", nsPath("c5"), extra+`,"cniCacheDir":"`+dir+`"`)
		n.add(t, legacy)
		legacy.cache(t, dir)
		// What an ADD of an earlier plugin leaves: rules and a cache
		// entry, no record; the ledger began later (another ADD).
		if _, err := n.fh.Ledger.Forget(plan.Owner{Network: "net1", ContainerID: "c5", IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
		past := time.Now().Add(-time.Minute)
		os.Chtimes(filepath.Join(dir, "results", "net1-c5-eth0"), past, past)
		flush(t)
		if rep, err := n.agent.Sync(o); err != nil || rep.Summary.Repaired != 1 || len(rep.Withheld) != 0 {
			t.Fatalf("pass over an entry older than the ledger: %+v %v, want it repaired", rep, err)
		}
		// Its DEL leaves a Del record while the runtime caches it; a pass
		// that read the cache before the DEL brings nothing back.
		var afterDel string
		n.onLock = func() { n.del(t, legacy); afterDel = n.state(t) }
		rep, err := n.agent.Sync(o)
		if err != nil || n.state(t) != afterDel || n.holds(t, "c5", legacy.ip) {
			t.Errorf("pass after the DEL of an attachment older than the ledger: %v\n%s", err, n.state(t))
		}
		if len(rep.Withheld) != 1 || rep.Withheld[0].Reason != agent.WithheldDeleted {
			t.Errorf("withheld %+v, want c5 deleted", rep.Withheld)
		}
		// The runtime removes its entry: the record goes with it.
		os.Remove(filepath.Join(dir, "results", "net1-c5-eth0"))
		if _, err := n.agent.Sync(o); err != nil {
			t.Fatal(err)
		}
		if got := n.fh.Ledger.String(); got != "" {
			t.Errorf("records left: %s", got)
		}
	})
}
