package attach

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
)

// typedMappings is runtimeConfig.portMappings decoded by hand: a Podman
// range sends thousands of entries, and encoding/json spends most of a
// verb's time on them by reflection. It takes the plain shape runtimes
// send — objects of numbers, strings and nulls, keys matched without
// regard to case, as encoding/json matches them — and gives exactly what
// encoding/json would; anything else (a fraction, an escape in a string,
// a nested value, bytes beyond ASCII) is refused, and Parse reads
// the request the slow way, which also words the errors.
type typedMappings []typedMapping

// errNotPlain sends Parse down its slow path.
var errNotPlain = errors.New("portMappings: not of the plain shape")

// UnmarshalJSON is called by encoding/json with valid JSON.
func (m *typedMappings) UnmarshalJSON(b []byte) error {
	s := scanner{b: b}
	if s.literal("null") {
		*m = nil
		return nil
	}
	if !s.next('[') {
		return errNotPlain
	}
	out := make(typedMappings, 0, bytes.Count(b, []byte{'{'}))
	if s.next(']') {
		*m = out
		return nil
	}
	for {
		t, ok := s.mapping()
		if !ok {
			return errNotPlain
		}
		out = append(out, t)
		if s.next(',') {
			continue
		}
		if s.next(']') && s.end() {
			*m = out
			return nil
		}
		return errNotPlain
	}
}

// scanner reads JSON bytes from i on.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// next consumes c (after white space) if it comes next.
func (s *scanner) next(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) end() bool {
	s.space()
	return s.i == len(s.b)
}

// literal consumes word (null, true, false) if it comes next.
func (s *scanner) literal(word string) bool {
	s.space()
	if bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		s.i += len(word)
		return true
	}
	return false
}

// mapping reads one object of the array.
func (s *scanner) mapping() (typedMapping, bool) {
	var t typedMapping
	if !s.next('{') {
		return t, false
	}
	if s.next('}') {
		return t, true
	}
	for {
		key, ok := s.raw()
		if !ok || !s.next(':') {
			return t, false
		}
		switch {
		case bytes.EqualFold(key, keyHostPort):
			t.HostPort, ok = s.integer(t.HostPort)
		case bytes.EqualFold(key, keyContainerPort):
			t.ContainerPort, ok = s.integer(t.ContainerPort)
		case bytes.EqualFold(key, keyProtocol):
			t.Protocol, ok = s.strOrNull(t.Protocol)
		case bytes.EqualFold(key, keyHostIP):
			t.HostIP, ok = s.strOrNull(t.HostIP)
		default:
			ok = s.scalar()
		}
		if !ok {
			return t, false
		}
		if s.next(',') {
			continue
		}
		return t, s.next('}')
	}
}

var (
	keyHostPort      = []byte("hostPort")
	keyContainerPort = []byte("containerPort")
	keyProtocol      = []byte("protocol")
	keyHostIP        = []byte("hostIP")
)

// raw reads a string of printable ASCII without escapes, and returns its
// bytes.
func (s *scanner) raw() ([]byte, bool) {
	if !s.next('"') {
		return nil, false
	}
	for j := s.i; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			v := s.b[s.i:j]
			s.i = j + 1
			return v, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, false
		}
	}
	return nil, false
}

// str is raw as a string; the protocols runtimes send are not copied.
func (s *scanner) str() (string, bool) {
	v, ok := s.raw()
	switch string(v) {
	case "tcp":
		return "tcp", ok
	case "udp":
		return "udp", ok
	case "":
		return "", ok
	}
	return string(v), ok
}

// strOrNull reads a string; null leaves old, as encoding/json does.
func (s *scanner) strOrNull(old string) (string, bool) {
	if s.literal("null") {
		return old, true
	}
	return s.str()
}

// integer reads a JSON number that is an integer of type int (no
// fraction, no exponent); null leaves old, as encoding/json does.
func (s *scanner) integer(old int) (int, bool) {
	if s.literal("null") {
		return old, true
	}
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return 0, false
	}
	n, err := strconv.Atoi(string(s.b[start:s.i]))
	return n, err == nil
}

// scalar skips a value of a key it does not know: a number, a string, a
// literal. A nested value is refused.
func (s *scanner) scalar() bool {
	s.space()
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, ok := s.raw()
		return ok
	case c == '-' || (c >= '0' && c <= '9'):
		for s.i < len(s.b) && strings.IndexByte("+-.eE0123456789", s.b[s.i]) >= 0 {
			s.i++
		}
		return true
	}
	return s.literal("null") || s.literal("true") || s.literal("false")
}
