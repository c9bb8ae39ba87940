package socket

import (
	"errors"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Memory is a Site in memory, the way the backends have an in-memory
// kernel: entries of every namespace, owner entries, and each hook's
// link as the kernel would report it. Unit tests drive the layer's
// decisions through it; the real kernel judges the programs
// (test/kernel, test/e2e).
type Memory struct {
	Entries map[Key]Value
	// Owners are the owner entries by namespace, family and owner.
	Owners map[OwnerKey]plan.Owner
	// Links is each hook's problem; a hook absent from it is missing.
	Links map[string]Problem
	// NotReady is what Ready and Install answer.
	NotReady error
	// Installs counts what Install did, by action.
	Installs map[string]int
	// Writes counts the writes that changed something.
	Writes int
	// Reads counts the reads of a family's whole state.
	Reads int
}

// NewMemory returns a site with nothing installed.
func NewMemory() *Memory {
	return &Memory{Entries: map[Key]Value{}, Owners: map[OwnerKey]plan.Owner{},
		Links: map[string]Problem{}, Installs: map[string]int{}}
}

func (m *Memory) Exists() bool { return len(m.Links) > 0 }

// OwnerKey names an owner entry.
type OwnerKey struct {
	Netns  uint64
	Family plan.Family
	ID     uint64
}

func (m *Memory) Read(netns uint64, f plan.Family) (*State, error) {
	m.Reads++
	st := &State{Entries: map[Key]Value{}, Owners: map[uint64]plan.Owner{}}
	for k, v := range m.Entries {
		if k.Netns == netns && k.Family() == f {
			st.Entries[k] = v
		}
	}
	for k, o := range m.Owners {
		if k.Netns == netns && k.Family == f {
			st.Owners[k.ID] = o
		}
	}
	return st, nil
}

func (m *Memory) ReadKeys(netns uint64, f plan.Family, keys []Key, id uint64) (*State, error) {
	st := &State{Entries: map[Key]Value{}, Owners: map[uint64]plan.Owner{}}
	for _, k := range keys {
		if v, ok := m.Entries[k]; ok {
			st.Entries[k] = v
		}
	}
	if o, ok := m.Owners[OwnerKey{netns, f, id}]; ok {
		st.Owners[id] = o
	}
	return st, nil
}

func (m *Memory) Write(netns uint64, f plan.Family, w *Write) error {
	if w.Empty() {
		return nil
	}
	if !m.Exists() {
		return errors.New("socket path: write to a site never installed")
	}
	m.Writes++
	for id, o := range w.PutOwners {
		m.Owners[OwnerKey{netns, f, id}] = o
	}
	for _, e := range w.Put {
		m.Entries[e.Key] = e.Value
	}
	for _, k := range w.Delete {
		if _, ok := m.Entries[k]; !ok {
			return errors.New("socket path: delete of a missing entry " + k.String())
		}
		delete(m.Entries, k)
	}
	for _, id := range w.DelOwners {
		if _, ok := m.Owners[OwnerKey{netns, f, id}]; !ok {
			return errors.New("socket path: delete of a missing owner entry")
		}
		delete(m.Owners, OwnerKey{netns, f, id})
	}
	return nil
}

func (m *Memory) Hooks() ([]HookState, error) {
	out := make([]HookState, len(Hooks))
	for i, h := range Hooks {
		p, ok := m.Links[h.Name]
		if !ok {
			p = HookMissing
		}
		out[i] = HookState{Hook: h, Problem: p}
	}
	return out, nil
}

func (m *Memory) Install(states []HookState) error {
	if m.NotReady != nil {
		return m.NotReady
	}
	for _, st := range states {
		if a := st.Action(); a != "" {
			m.Installs[a]++
		}
		m.Links[st.Hook.Name] = HookOK
	}
	return nil
}

func (m *Memory) Ready() error { return m.NotReady }

func (m *Memory) Retire() (bool, error) {
	if !m.Exists() || len(m.Entries) > 0 || len(m.Owners) > 0 {
		return false, nil
	}
	m.Links = map[string]Problem{}
	return true, nil
}
