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
		t, ok := s.mapping()
		if !ok || !take(t) {
			return false
		}
		if s.next(',') {
			continue
		}
		return s.next(']')
	}
}

// scanner reads JSON bytes from i on.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	// one comparison for the byte that is not white space, most often
	for s.i < len(s.b) && s.b[s.i] <= ' ' && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
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
	s.space()
	if t, ok := s.quickMapping(); ok {
		return t, true
	}
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

// quickMapping reads, in one pass, an entry spelled as runtimes spell
// it: the four keys as written here, in any order; at most a space
// around colons and commas; ports of up to five digits; protocol and
// hostIP strings of plain bytes. For anything else it leaves the
// scanner where it was, and mapping reads the entry the general way
// (which also refuses what must be refused): a range of 5000 ports is
// 5000 entries, and this is most of the time a verb spends on them.
func (s *scanner) quickMapping() (t typedMapping, ok bool) {
	b, i := s.b, s.i
	if i >= len(b) || b[i] != '{' {
		return t, false
	}
	i++
	for {
		i = oneSpace(b, i)
		key := quickKey(b, i)
		if key == "" {
			return t, false
		}
		if i = oneSpace(b, i+len(key)+2); i >= len(b) || b[i] != ':' {
			return t, false
		}
		i = oneSpace(b, i+1)
		switch key {
		case keyHostPort, keyContainerPort:
			n, k := 0, i
			for k < len(b) && k-i < 5 && b[k] >= '0' && b[k] <= '9' {
				n = n*10 + int(b[k]-'0')
				k++
			}
			if k == i || b[i] == '0' || k == len(b) || b[k] >= '0' && b[k] <= '9' || b[k] == '.' || b[k] == 'e' || b[k] == 'E' {
				return t, false
			}
			if key[0] == 'h' {
				t.HostPort = n
			} else {
				t.ContainerPort = n
			}
			i = k
		case keyProtocol, keyHostIP:
			v, k, ok := quickString(b, i)
			if !ok {
				return t, false
			}
			if key[0] == 'p' {
				t.Protocol = intern(v)
			} else {
				t.HostIP = intern(v)
			}
			i = k
		default:
			return t, false
		}
		switch i = oneSpace(b, i); {
		case i < len(b) && b[i] == ',':
			i++
		case i < len(b) && b[i] == '}':
			s.i = i + 1
			return t, true
		default:
			return t, false
		}
	}
}

// quickKey is the field whose key, quoted, is at i; "" for another.
func quickKey(b []byte, i int) string {
	if i+1 >= len(b) || b[i] != '"' {
		return ""
	}
	var f string
	switch b[i+1] {
	case 'h':
		f = keyHostPort
		if i+5 < len(b) && b[i+5] == 'I' {
			f = keyHostIP
		}
	case 'c':
		f = keyContainerPort
	case 'p':
		f = keyProtocol
	default:
		return ""
	}
	if end := i + 1 + len(f); end < len(b) && string(b[i+1:end]) == f && b[end] == '"' {
		return f
	}
	return ""
}

// oneSpace is i past a space, if one is there.
func oneSpace(b []byte, i int) int {
	if i < len(b) && b[i] == ' ' {
		return i + 1
	}
	return i
}

// quickString reads the string of plain bytes (raw's) at i: its bytes
// and the index after it.
func quickString(b []byte, i int) (v []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, false
	}
	if i+4 < len(b) && b[i+4] == '"' && (string(b[i+1:i+4]) == "tcp" || string(b[i+1:i+4]) == "udp") {
		return b[i+1 : i+4], i + 5, true
	}
	k := i + 1
	for k < len(b) && plainByte[b[k]] {
		k++
	}
	if k == len(b) || b[k] != '"' {
		return nil, i, false
	}
	return b[i+1 : k], k + 1, true
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
	if j == len(s.b) || s.b[j] != '"' {
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
	if s.i < len(s.b) && s.b[s.i] == 'n' {
		return old, s.literal("null")
	}
	return s.str()
}

// integer reads a JSON number that is an integer of type int (no
// fraction, no exponent, no leading zero); null leaves old, as
// encoding/json does. Anything else is refused.
func (s *scanner) integer(old int) (int, bool) {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == 'n' {
		return old, s.literal("null")
	}
	neg := s.i < len(s.b) && s.b[s.i] == '-'
	if neg {
		s.i++
	}
	start, n := s.i, 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		if s.i-start >= 18 { // beyond what an int surely holds: the slow path says
			return 0, false
		}
		n = n*10 + int(s.b[s.i]-'0')
		s.i++
	}
	switch digits := s.i - start; {
	case digits == 0, digits > 1 && s.b[start] == '0':
		return 0, false
	case s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E'):
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
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case digits() == 0:
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
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
	if s.i >= len(s.b) {
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
