package attach

import (
	"errors"
	"io"
	"slices"
)

// A request is read from its source as the scanner goes, a window at a
// time, and the entries of a range that come spelled as encoding/json
// spells them — "," and the entry before with both ports one up — are
// let go once read: a Podman range of 5000 ports is 330 KB of JSON,
// which would otherwise be copied into as much fresh memory (some 80
// pages, each a fault) to be read once. What is let go is noted
// (elision), and the request as it came can be spelled again (whole)
// for the paths that read it another way.

const (
	// window is the most one read of the source takes.
	window = 64 << 10
	// quickRoom is what the quick readers of an entry are given to
	// read in b: an entry runtimes send is a tenth of it.
	quickRoom = 4 << 10
)

// source is where a scanner reads more of its bytes from.
type source struct {
	src  io.Reader // nil: b is all there is
	done bool      // src has no more
	err  error     // what ended src, other than io.EOF

	// The range entries read since drop (open) that may be let go,
	// n of them, the first spelled as from.next.
	open bool
	drop int
	n    int
	from shape

	elided []elision
}

// elision is n entries of a range let go at at in b, the first of
// which was spelled from.next, each after a comma.
type elision struct {
	at   int
	n    int
	from shape
}

// has reports whether b holds n bytes from i on, reading more as needed.
func (s *scanner) has(n int) bool {
	return len(s.b)-s.i >= n || s.fill(n)
}

// fill reads the source into b until it holds n bytes from i on, or the
// source ends; it reports whether b then holds them.
func (s *scanner) fill(n int) bool {
	idle := 0
	for s.src != nil && !s.done && len(s.b)-s.i < n {
		if len(s.b) == cap(s.b) {
			s.b = slices.Grow(s.b, max(cap(s.b), window))
		}
		k, err := s.src.Read(s.b[len(s.b):min(cap(s.b), len(s.b)+window)])
		s.b = s.b[:len(s.b)+k]
		if k == 0 && err == nil {
			if idle++; idle == 100 {
				err = io.ErrNoProgress
			}
		}
		if err != nil {
			s.done = true
			if !errors.Is(err, io.EOF) {
				s.err = err
			}
		}
	}
	return len(s.b)-s.i >= n
}

// tight reads, in a range, entries that each come as "," and then the
// entry that continues the one before, spelled with nothing between
// them (as encoding/json writes them), as many as b holds; it says how
// many. Read from a source, such entries are let go (letGo) when b is
// to take more.
func (s *scanner) tight() int {
	sh := &s.shape
	k := 0
	for {
		need := 1 + len(sh.next)
		if need == 1 || len(s.b)-s.i < need || s.b[s.i] != ',' || string(s.b[s.i+1:s.i+need]) != string(sh.next) {
			return k
		}
		if s.src != nil && !s.open {
			s.open, s.drop, s.n = true, s.i, 0
			s.from = sh.clone()
		}
		s.i += need
		s.n++
		k++
		sh.advance()
	}
}

// letGo lets go of the range entries read since drop, noting them,
// before b takes more.
func (s *scanner) letGo() {
	if !s.open || s.n == 0 {
		return
	}
	s.elided = append(s.elided, elision{at: s.drop, n: s.n, from: s.from})
	k := copy(s.b[s.drop:], s.b[s.i:])
	s.b = s.b[:s.drop+k]
	s.i = s.drop
	s.open = false
}

// whole reads the rest of the source and returns the request as it
// came: b, with the entries let go spelled again where they were (b
// then holds it; the scanner is done).
func (s *scanner) whole() []byte {
	for s.fill(len(s.b) - s.i + 1) {
	}
	if len(s.elided) == 0 {
		return s.b
	}
	defer func() { s.elided, s.i = nil, len(s.b) }()
	size := len(s.b)
	for _, e := range s.elided {
		size += e.n * (1 + len(e.from.next) + 2)
	}
	out := make([]byte, 0, size)
	last := 0
	for _, e := range s.elided {
		out = append(out, s.b[last:e.at]...)
		sh := e.from.clone()
		for range e.n {
			out = append(append(out, ','), sh.next...)
			sh.advance()
		}
		last = e.at
	}
	s.b = append(out, s.b[last:]...)
	return s.b
}
