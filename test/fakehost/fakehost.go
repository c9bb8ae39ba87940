// Package fakehost is a host (pkg/host) for the plugin's and the agent's
// unit tests. It keeps what a node would hold as state a test reads: the
// ledger, route_localnet, the conntrack flushes and walks, the times the
// host lock was taken; NewInMemory puts the real backends over kernels in
// memory under it, so a verb is judged by what they hold afterwards. Its
// call log is for a test about order; its recording backends, for one
// about what a unit was answered.
package fakehost

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/conntrack"
	"github.com/portmap-dev/portmap/pkg/converge"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Host records every call the plugin's verbs and the agent make of a
// host: opening a backend or layer, what each is asked, route_localnet,
// conntrack flushes, the lock. Its knobs make calls fail.
type Host struct {
	mu    sync.Mutex
	calls []string
	// SyncAnswer answers a backend's Sync (name is the backend's or
	// layer's); nil: everything ok, nothing else.
	SyncAnswer func(name string, f plan.Family, want []*plan.Plan, o converge.Options) *converge.Report
	// FailApply fails Apply by backend or layer and family ("iptables
	// ipv6"); FailAll fails every backend call.
	FailApply map[string]error
	FailAll   error
	// FailSync fails a pass's Sync by backend or layer and family.
	FailSync map[string]error
	// FailReady fails Ready alone (a layer the host cannot serve, say).
	FailReady error
	// FailOpen fails opening the backend or layer of that name.
	FailOpen map[string]error
	// Missing is what Skeleton answers by backend or layer and family
	// ("nftables ipv6"): a shared object found missing. Traces says that
	// some of the shared objects of a family with one missing exist.
	Missing map[string]string
	Traces  map[string]bool
	// SkeletonReads counts the reads of shared objects (Skeleton).
	SkeletonReads int
	// Localnet is route_localnet per interface; FailSysctl fails turning
	// it on.
	Localnet   map[string]bool
	FailSysctl error
	Log        bytes.Buffer
	// Installed is what Mappings reads back, by backend or layer and
	// family ("nftables ipv4").
	Installed map[string][]plan.Installed
	// Flushed are the conntrack ports flushed so far, in order; Walks,
	// the walks of the conntrack table that flushed them.
	Flushed []conntrack.Port
	Walks   int
	// Locks counts the times the host lock was taken.
	Locks int
	// Ledger is the host's ledger; its writes and forgets are recorded
	// ("ledger add net1/c1/eth0", "ledger forget net1/c1/eth0").
	Ledger Ledger
}

// New returns a host whose registry holds recording fakes of the
// real backends and layers (same names, same Wants), and the recorder.
func New() (*host.Host, *Host) {
	fh := &Host{FailApply: map[string]error{}, FailSync: map[string]error{}, FailOpen: map[string]error{}, Missing: map[string]string{}, Traces: map[string]bool{}, Localnet: map[string]bool{}}
	h := &host.Host{
		DefaultBackend: func() backend.Name { return backend.IPTables },
		Sysctl:         fh,
		Conntrack:      fh,
		Lock: func() (func(), error) {
			fh.Record("lock")
			fh.mu.Lock()
			fh.Locks++
			fh.mu.Unlock()
			return func() {}, nil
		},
		Ledger: recLedger{fh},
		Log:    &fh.Log,
	}
	for _, k := range backend.Kinds {
		name := string(k.Name)
		k.Open = func(f plan.Family, _ io.Writer) (backend.Backend, error) {
			return fh.open("backend "+name, name, f)
		}
		h.Kinds = append(h.Kinds, k)
	}
	for _, l := range backend.Layers {
		name := l.Name
		l.Open = func(f plan.Family, _ io.Writer, _ *plan.Request) (backend.Backend, error) {
			return fh.open("layer "+name, name, f)
		}
		h.Layers = append(h.Layers, l)
	}
	return h, fh
}

func (h *Host) open(call, name string, f plan.Family) (backend.Backend, error) {
	h.Record(call + " " + f.String())
	if err := h.FailOpen[name]; err != nil {
		return nil, err
	}
	return fakeBackend{h, f, name}, nil
}

// Record appends a call.
func (h *Host) Record(call string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, call)
}

// Calls returns the calls so far, one a line.
func (h *Host) Calls() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.calls, "\n")
}

// CallList returns the calls so far.
func (h *Host) CallList() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.calls...)
}

type fakeBackend struct {
	h    *Host
	f    plan.Family
	name string
}

var _ backend.Backend = fakeBackend{}

func (b fakeBackend) Sync(want []*plan.Plan, o converge.Options) (*converge.Report, error) {
	var ids []string
	for _, p := range want {
		ids = append(ids, p.Owner.ContainerID)
	}
	b.h.Record(fmt.Sprintf("sync %s %s [%s] prune=%v dry=%v", b.name, b.f, strings.Join(ids, " "), o.Prune, o.DryRun))
	if b.h.FailAll != nil {
		return nil, b.h.FailAll
	}
	if err := b.h.FailSync[b.name+" "+b.f.String()]; err != nil {
		return nil, err
	}
	if b.h.SyncAnswer != nil {
		return b.h.SyncAnswer(b.name, b.f, want, o), nil
	}
	return converge.NewReport(len(want)), nil
}

func (b fakeBackend) Apply(p *plan.Plan) error {
	return b.record("apply", p, b.h.FailApply[b.name+" "+b.f.String()])
}
func (b fakeBackend) Remove(p *plan.Plan) error { return b.record("remove", p, nil) }
func (b fakeBackend) Check(p *plan.Plan) error  { return b.record("check", p, nil) }
func (b fakeBackend) GC(network string, valid []plan.Owner) error {
	var v []string
	for _, o := range valid {
		v = append(v, o.Network+"/"+o.ContainerID+"/"+o.IfName)
	}
	b.h.Record(fmt.Sprintf("gc %s %s [%s]", b.f, network, strings.Join(v, " ")))
	return b.h.FailAll
}
func (b fakeBackend) Ready(*plan.Plan) error {
	b.h.Record("ready " + b.f.String())
	if b.h.FailReady != nil {
		return b.h.FailReady
	}
	return b.h.FailAll
}
func (b fakeBackend) Mappings() ([]plan.Installed, error) {
	return b.h.Installed[b.name+" "+b.f.String()], b.h.FailAll
}

// Skeleton makes every fake Skeletal: Missing says what is missing,
// Traces whether some shared objects are left.
func (b fakeBackend) Skeleton(*plan.Plan) (string, bool, error) {
	key := b.name + " " + b.f.String()
	b.h.Record("skeleton " + key)
	b.h.mu.Lock()
	b.h.SkeletonReads++
	b.h.mu.Unlock()
	missing := b.h.Missing[key]
	return missing, missing == "" || b.h.Traces[key], b.h.FailAll
}

var _ backend.Skeletal = fakeBackend{}

func (b fakeBackend) record(op string, p *plan.Plan, err error) error {
	b.h.Record(describe(op, p))
	if b.h.FailAll != nil {
		return b.h.FailAll
	}
	return err
}

// describe is a call of op on p as the log records it.
func describe(op string, p *plan.Plan) string {
	var ms []string
	for m := range p.Mappings.All() {
		ms = append(ms, m.String())
	}
	ip := "-"
	if p.ContainerNet != nil {
		ip = p.ContainerNet.IP.String()
	}
	return fmt.Sprintf("%s %s %s/%s/%s %s [%s]", op, p.Family, p.Owner.Network, p.Owner.ContainerID, p.Owner.IfName, ip, strings.Join(ms, " "))
}

func (h *Host) HostInterface(ip net.IP) (string, error) { return "veth-" + ip.String(), nil }
func (h *Host) HostInterfaces(ips []net.IP) ([]string, error) {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i], _ = h.HostInterface(ip)
	}
	return out, nil
}
func (h *Host) EnableRouteLocalnet(ifName string) error {
	h.Record("route_localnet " + ifName)
	if h.FailSysctl != nil {
		return h.FailSysctl
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Localnet[ifName] = true
	return nil
}
func (h *Host) RouteLocalnet(ifName string) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.Localnet[ifName], nil
}
func (h *Host) FlushDstPorts(ports []conntrack.Port) error {
	h.mu.Lock()
	h.Flushed = append(h.Flushed, ports...)
	h.Walks++
	h.mu.Unlock()
	for _, pp := range ports {
		if pp.Addr.IsValid() {
			h.Record(fmt.Sprintf("flush %s %s %d at %s", pp.Family, pp.Protocol, pp.Port, pp.Addr))
			continue
		}
		h.Record(fmt.Sprintf("flush %s %s %d", pp.Family, pp.Protocol, pp.Port))
	}
	h.Record("flushed")
	return nil
}

// recLedger records the writes and forgets of the host's ledger.
type recLedger struct{ h *Host }

func (l recLedger) Write(r ledger.Record) error {
	l.h.Record(fmt.Sprintf("ledger %s %s/%s/%s", r.Verb, r.Network, r.ContainerID, r.IfName))
	return l.h.Ledger.Write(r)
}

func (l recLedger) Read() (map[plan.Owner]ledger.Record, time.Time, error) { return l.h.Ledger.Read() }

func (l recLedger) Forget(o plan.Owner) (bool, error) {
	l.h.Record(fmt.Sprintf("ledger forget %s/%s/%s", o.Network, o.ContainerID, o.IfName))
	return l.h.Ledger.Forget(o)
}
