package portmap

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/attach"
	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fakehost"
)

var owner1 = plan.Owner{Network: "net1", ContainerID: "c1", IfName: "eth0"}

// ADD records the attachment before any rule, with what it maps and its
// namespace; DEL forgets it before removing anything.
func TestAddAndDelKeepTheLedger(t *testing.T) {
	p, h, _ := newFake()
	a := args(t, withMappings(map[string]string{"prevResult": prevDual}))
	if err := p.Add(a); err != nil {
		t.Fatal(err)
	}
	recs, _, _ := h.Ledger.Read()
	r, ok := recs[owner1]
	att, err := attach.Load(p.Host, a.StdinData, a.ContainerID, a.IfName)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || r.Verb != ledger.Add || r.NetNS != "/run/netns/c" || r.Plans != plan.Fingerprint(att.Plans) || r.Plans == plan.Fingerprint(nil) {
		t.Errorf("record after ADD: %+v (present %t), want add, the netns and the plans' fingerprint", r, ok)
	}
	calls := h.Calls()
	if strings.Index(calls, "ledger add") > strings.Index(calls, "apply ") {
		t.Errorf("calls:\n%s\nwant the record before the first rule", calls)
	}
	if err := p.Del(args(t, nil)); err != nil {
		t.Fatal(err)
	}
	if s := h.Ledger.String(); s != "" {
		t.Errorf("records after DEL: %q, want none", s)
	}
	calls = h.Calls()
	if strings.LastIndex(calls, "ledger forget") > strings.LastIndex(calls, "remove ") {
		t.Errorf("calls:\n%s\nwant the record forgotten before the first removal", calls)
	}
}

// ADD of "localhost": "auto" records what it resolved it to, for the
// agent to plan the attachment alike; of "nat" or "socket", nothing.
func TestAddRecordsWhatAutoResolvedTo(t *testing.T) {
	for _, tt := range []struct {
		localhost string
		ready     error
		want      plan.Localhost
	}{
		{`"auto"`, errors.New("no bpf filesystem"), plan.LocalhostNAT},
		{`"auto"`, nil, plan.LocalhostSocket},
		{`"nat"`, nil, ""},
	} {
		p, h, _ := newFake()
		p.Host.SocketReady = func(*plan.Request) error { return tt.ready }
		if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual, "localhost": tt.localhost}))); err != nil {
			t.Fatal(err)
		}
		recs, _, _ := h.Ledger.Read()
		if got := recs[owner1].Localhost; got != tt.want {
			t.Errorf("localhost %s, socket path ready %v: recorded %q, want %q", tt.localhost, tt.ready == nil, got, tt.want)
		}
	}
}

// DEL of an attachment without a record — ADDed before this node's
// plugin kept a ledger — leaves a Del record while the runtime caches
// it, and nothing once the runtime has removed its entry (the second DEL
// a runtime may send).
func TestDelOfAnAttachmentOlderThanTheLedger(t *testing.T) {
	cache := t.TempDir()
	extra := map[string]string{"cniCacheDir": strconv.Quote(cache)}
	p, h, _ := newFake()
	if err := os.MkdirAll(filepath.Join(cache, "results"), 0o700); err != nil {
		t.Fatal(err)
	}
	entry := filepath.Join(cache, "results", "net1-c1-eth0")
	if err := os.WriteFile(entry, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Del(args(t, extra)); err != nil {
		t.Fatal(err)
	}
	if s := h.Ledger.String(); s != "del net1/c1/eth0" {
		t.Errorf("records after DEL of a cached attachment without record: %q, want its Del record", s)
	}
	os.Remove(entry)
	if _, err := h.Ledger.Forget(owner1); err != nil {
		t.Fatal(err)
	}
	if err := p.Del(args(t, extra)); err != nil {
		t.Fatal(err)
	}
	if s := h.Ledger.String(); s != "" {
		t.Errorf("records after DEL of an uncached attachment: %q, want none", s)
	}
}

// A ledger that cannot be written fails ADD before any rule; DEL removes
// the rules all the same and says why on stderr.
func TestLedgerFailures(t *testing.T) {
	p, h, out, mem := onMemory()
	if err := p.Add(args(t, withMappings(map[string]string{"prevResult": prevDual}))); err != nil {
		t.Fatal(err)
	}
	before := held(t, mem)
	out.Reset()
	h.Ledger.Fail = errors.New("read-only file system")
	a := args(t, withMappings(map[string]string{"prevResult": strings.ReplaceAll(prevDual, "::2/", "::3/")}))
	a.ContainerID = "c2"
	err := p.Add(a)
	if codeOf(err) != 999 || !strings.Contains(err.Error(), "record the ADD in the ledger: read-only file system") || out.Len() != 0 {
		t.Errorf("ADD: %v, stdout %q: want the error", err, out)
	}
	if got := held(t, mem); !slices.Equal(got, before) {
		t.Errorf("after the ADD that could not record itself the kernels hold %q, want c1's only: %q", got, before)
	}
	if err := p.Del(args(t, nil)); err != nil {
		t.Errorf("DEL: %v, want the rules removed all the same", err)
	}
	if got := held(t, mem); len(got) != 0 || !strings.Contains(h.Log.String(), "read-only file system") {
		t.Errorf("after DEL the kernels hold %q, log %q: want nothing held and the reason said", got, h.Log.String())
	}
}

// GC forgets the records of its network that no valid attachment owns,
// and no other network's.
func TestGCForgetsInvalidRecords(t *testing.T) {
	p, h, _ := newFake()
	for _, o := range []plan.Owner{owner1, {Network: "net1", ContainerID: "c2", IfName: "eth0"}, {Network: "net2", ContainerID: "c3", IfName: "eth0"}} {
		if err := h.Ledger.Write(ledger.New(o, ledger.Add)); err != nil {
			t.Fatal(err)
		}
	}
	a := args(t, map[string]string{"cniVersion": `"1.1.0"`, "cni.dev/valid-attachments": `[{"containerID":"c1","ifname":"eth0"}]`})
	if err := p.GC(a); err != nil {
		t.Fatal(err)
	}
	if got := h.Ledger.String(); got != "add net1/c1/eth0\nadd net2/c3/eth0" {
		t.Errorf("records after GC:\n%s\nwant the valid one and the other network's", got)
	}
}

// A DEL that cannot take the host lock to record itself removes nothing
// and answers code 11, "try again later": removing the rules with the ADD
// still on record would let a pass that read the cache entry before the
// runtime removed it bring them back. Its retry, with the lock free,
// removes them.
func TestDelWithoutItsRecordRemovesNothing(t *testing.T) {
	h, _ := fakehost.New()
	k := fakehost.BackendsInMemory(h)[backend.NFTables]
	p := &Plugin{Stdout: &bytes.Buffer{}, Host: h}
	conf := withMappings(map[string]string{"backend": `"nftables"`, "prevResult": prevDual})
	if err := p.Add(args(t, conf)); err != nil {
		t.Fatal(err)
	}
	mapped := func() []string {
		return k.Mapped(t, func(m plan.Installed) string {
			return fmt.Sprintf("%s %s %d", m.Owner.ContainerID, m.ContainerIP, m.HostPort)
		})
	}
	before := mapped()
	if len(before) == 0 {
		t.Fatal("ADD mapped nothing")
	}
	free := h.Lock
	h.Lock = func() (func(), error) { return nil, fmt.Errorf("the portmap lock: %w", lock.ErrTimeout) }
	if err := p.Del(args(t, conf)); codeOf(err) != 11 {
		t.Errorf("DEL with the host lock held: %v (code %d), want code 11", err, codeOf(err))
	}
	if got := mapped(); !slices.Equal(got, before) {
		t.Errorf("DEL that could not record itself removed %q of %q", got, before)
	}
	if recs, _, _ := h.Ledger.Read(); recs[owner1].Verb != ledger.Add {
		t.Errorf("the record after the failed DEL: %+v, want the ADD's", recs[owner1])
	}
	h.Lock = free
	if err := p.Del(args(t, conf)); err != nil {
		t.Fatal(err)
	}
	if got := mapped(); len(got) != 0 {
		t.Errorf("after the retried DEL: %q, want nothing", got)
	}
}
