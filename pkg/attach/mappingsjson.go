package attach

import (
	"bytes"
	"errors"
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
	if s.literal("null") && s.end() {
		*m = nil
		return nil
	}
	out := make(typedMappings, 0, bytes.Count(b, []byte{'{'}))
	if !s.mappings(func(t typedMapping) bool { out = append(out, t); return true }) || !s.end() {
		return errNotPlain
	}
	*m = out
	return nil
}

// mappings reads the array of mappings (or null) that comes next, and
// hands each entry to take; false when an entry is not of the plain
// shape or take refuses it.
func (s *scanner) mappings(take func(typedMapping) bool) bool {
	if s.literal("null") {
		return true
	}
	if !s.next('[') {
		return false
	}
	if s.next(']') {
		return true
	}
	for {
		if t, ok := s.mapping(); !ok || !take(t) {
			return false
		}
		if s.next(',') {
			continue
		}
		return s.next(']')
	}
}

// scanner reads JSON bytes of b from i on.
type scanner struct {
	b []byte
	i int
}

// has reports whether b holds n bytes from i on.
func (s *scanner) has(n int) bool { return len(s.b)-s.i >= n }

func (s *scanner) space() {
	// one comparison for the byte that is not white space, most often
	for s.has(1) && s.b[s.i] <= ' ' && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// next consumes c (after white space) if it comes next.
func (s *scanner) next(c byte) bool {
	s.space()
	if s.has(1) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) end() bool {
	s.space()
	return !s.has(1)
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
		switch field(key) {
		case keyHostPort:
			t.HostPort, ok = s.integer(t.HostPort)
		case keyContainerPort:
			t.ContainerPort, ok = s.integer(t.ContainerPort)
		case keyProtocol:
			t.Protocol, ok = s.strOrNull(t.Protocol)
		case keyHostIP:
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

// The fields of a mapping.
const (
	keyHostPort      = "hostPort"
	keyContainerPort = "containerPort"
	keyProtocol      = "protocol"
	keyHostIP        = "hostIP"
)

// field is the field key names, matched as encoding/json matches it,
// without regard to case (the spelling runtimes send is compared first);
// "" for none.
func field(key []byte) string {
	switch string(key) { // no copy: the constants are returned
	case keyHostPort:
		return keyHostPort
	case keyContainerPort:
		return keyContainerPort
	case keyProtocol:
		return keyProtocol
	case keyHostIP:
		return keyHostIP
	}
	for _, f := range [...]string{keyHostPort, keyContainerPort, keyProtocol, keyHostIP} {
		if bytes.EqualFold(key, []byte(f)) {
			return f
		}
	}
	return ""
}

// raw reads a string of printable ASCII without escapes, and returns its
// bytes.
func (s *scanner) raw() ([]byte, bool) {
	if !s.next('"') {
		return nil, false
	}
	j := s.i
	for j < len(s.b) && plainByte[s.b[j]] {
		j++
	}
	if j >= len(s.b) || s.b[j] != '"' {
		return nil, false // an escape, a control byte, a byte beyond ASCII, the end
	}
	v := s.b[s.i:j]
	s.i = j + 1
	return v, true
}

// plainByte is what raw takes inside a string: printable ASCII but the
// quote and the backslash.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str is raw as a string.
func (s *scanner) str() (string, bool) {
	v, ok := s.raw()
	return intern(v), ok
}

// intern is v as a string; the protocols runtimes send are not copied.
func intern(v []byte) string {
	switch string(v) {
	case "tcp":
		return "tcp"
	case "udp":
		return "udp"
	case "":
		return ""
	}
	return string(v)
}

// strOrNull reads a string; null leaves old, as encoding/json does.
func (s *scanner) strOrNull(old string) (string, bool) {
	s.space()
	if s.has(1) && s.b[s.i] == 'n' {
		return old, s.literal("null")
	}
	return s.str()
}

// integer reads a JSON number that is an integer of type int (no
// fraction, no exponent, no leading zero); null leaves old, as
// encoding/json does. Anything else is refused.
func (s *scanner) integer(old int) (int, bool) {
	s.space()
	if s.has(1) && s.b[s.i] == 'n' {
		return old, s.literal("null")
	}
	neg := s.has(1) && s.b[s.i] == '-'
	if neg {
		s.i++
	}
	start, n := s.i, 0
	for s.has(1) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		if s.i-start >= 18 { // beyond what an int surely holds: the slow path says
			return 0, false
		}
		n = n*10 + int(s.b[s.i]-'0')
		s.i++
	}
	switch digits := s.i - start; {
	case digits == 0, digits > 1 && s.b[start] == '0':
		return 0, false
	case s.has(1) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E'):
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// number reads a JSON number, exactly as the grammar has it:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() bool {
	s.space()
	digits := func() int {
		n := 0
		for s.has(1) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.has(1) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.has(1) && s.b[s.i] == '0':
		s.i++
	case digits() == 0:
		return false
	}
	if s.has(1) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return false
		}
	}
	if s.has(1) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.has(1) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}

// scalar skips a value of a key it does not know: a number, a string, a
// literal. A nested value is refused.
func (s *scanner) scalar() bool {
	s.space()
	if !s.has(1) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, ok := s.raw()
		return ok
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	}
	return s.literal("null") || s.literal("true") || s.literal("false")
}
