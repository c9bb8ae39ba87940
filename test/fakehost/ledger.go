package fakehost

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/portmap-dev/portmap/pkg/ledger"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Ledger is a ledger in memory.
type Ledger struct {
	mu      sync.Mutex
	records map[plan.Owner]ledger.Record
	// Epoch is when the ledger began. The first Write sets it, when
	// zero, to a second before: a file the test writes after that Write
	// has a later modification time even on the kernel's coarse clock,
	// as it has after the epoch file of a Dir.
	Epoch time.Time
	// Fail, when set, fails every call.
	Fail error
}

var _ ledger.Ledger = (*Ledger)(nil)

func (m *Ledger) Write(r ledger.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return m.Fail
	}
	if m.records == nil {
		m.records = map[plan.Owner]ledger.Record{}
	}
	if m.Epoch.IsZero() {
		m.Epoch = time.Now().Add(-time.Second)
	}
	m.records[r.Owner()] = r
	return nil
}

func (m *Ledger) Read() (map[plan.Owner]ledger.Record, time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return nil, time.Time{}, m.Fail
	}
	out := make(map[plan.Owner]ledger.Record, len(m.records))
	for o, r := range m.records {
		out[o] = r
	}
	return out, m.Epoch, nil
}

func (m *Ledger) Forget(o plan.Owner) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return false, m.Fail
	}
	_, ok := m.records[o]
	delete(m.records, o)
	return ok, nil
}

// String lists the records, one a line, sorted: "verb network/id/ifname".
func (m *Ledger) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var lines []string
	for o, r := range m.records {
		lines = append(lines, fmt.Sprintf("%s %s/%s/%s", r.Verb, o.Network, o.ContainerID, o.IfName))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
