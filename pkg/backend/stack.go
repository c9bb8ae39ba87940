package backend

import (
	"errors"
	"fmt"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Stack is what one CNI verb drives in one family: the configured backend
// and the layers the configuration turned on, as one Verbs.
type Stack struct {
	Base   Backend
	Layers []Backend
	// ReadyFirst are the layers ADD asks before it writes.
	ReadyFirst []Backend
}

var _ Verbs = Stack{}

// Apply applies the backend, then each layer; when one fails, what this
// call applied is removed again.
func (s Stack) Apply(p *plan.Plan) error {
	if err := s.Base.Apply(p); err != nil {
		return err
	}
	for i, l := range s.Layers {
		if err := l.Apply(p); err != nil {
			errs := []error{err}
			for _, done := range append(s.Layers[:i:i], s.Base) {
				if uerr := done.Remove(p); uerr != nil {
					errs = append(errs, fmt.Errorf("undo: %w", uerr))
				}
			}
			return errors.Join(errs...)
		}
	}
	return nil
}

// Remove removes the layers' objects, then the backend's; it goes on
// after an error and returns them all.
func (s Stack) Remove(p *plan.Plan) error {
	var errs []error
	for _, l := range s.Layers {
		errs = append(errs, l.Remove(p))
	}
	return errors.Join(append(errs, s.Base.Remove(p))...)
}

// Check checks the backend, then each layer.
func (s Stack) Check(p *plan.Plan) error {
	return s.each(func(b Backend) error { return b.Check(p) })
}

// LayersReady asks the ReadyFirst layers whether they can serve p: ADD
// asks before it changes anything, so a host that cannot serve such a
// layer fails ADD with nothing written.
func (s Stack) LayersReady(p *plan.Plan) error {
	for _, l := range s.ReadyFirst {
		if err := l.Ready(p); err != nil {
			return err
		}
	}
	return nil
}

// Ready asks the backend, then each layer.
func (s Stack) Ready(p *plan.Plan) error {
	return s.each(func(b Backend) error { return b.Ready(p) })
}

// Skeleton names the first missing shared object of the backend or a
// layer; some exist when some of any of theirs do.
func (s Stack) Skeleton(p *plan.Plan) (missing string, some bool, err error) {
	for _, b := range append([]Backend{s.Base}, s.Layers...) {
		sk, ok := b.(Skeletal)
		if !ok {
			continue
		}
		m, so, err := sk.Skeleton(p)
		if err != nil {
			return "", false, err
		}
		if missing == "" {
			missing = m
		}
		some = some || so
	}
	return missing, some, nil
}

// GC collects in the backend and every layer; it goes on after an error.
func (s Stack) GC(network string, valid []plan.Owner) error {
	errs := []error{s.Base.GC(network, valid)}
	for _, l := range s.Layers {
		errs = append(errs, l.GC(network, valid))
	}
	return errors.Join(errs...)
}

func (s Stack) each(do func(Backend) error) error {
	if err := do(s.Base); err != nil {
		return err
	}
	for _, l := range s.Layers {
		if err := do(l); err != nil {
			return err
		}
	}
	return nil
}
