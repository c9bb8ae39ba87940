package attach

import (
	"bytes"
	"encoding/json"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// decodeFast reads a request whose port mappings are of the plain shape
// (mappingsjson.go) without handing them to encoding/json, which would
// scan them twice (its validity check, then the skip to the value's end)
// before the hand decoder read them a third time: 300 KB for a Podman
// range of 5000 ports. The walk below finds runtimeConfig.portMappings,
// reading every byte before it as strictly as encoding/json would; the
// hand decoder reads the array, strictly; encoding/json reads the rest,
// with null in the array's place. The entries become mappings as they
// are read (plainMapping), with no copy of them between. ok is false — and the caller reads the
// request the usual way — for anything the walk does not take: a key
// with an escape or beyond ASCII, runtimeConfig or portMappings twice,
// mappings of another shape or a value out of range, a request
// encoding/json refuses.
func decodeFast(stdin []byte) (nc netConf, ms plan.Mappings, ok bool) {
	s := &scanner{b: stdin}
	// an entry with the protocol and host IP of the one before it (every
	// entry of a range) reuses what was parsed of them
	var last typedMapping
	var lastM plan.Mapping
	start, end, ok := findMappings(s, func(t typedMapping) bool {
		if ms.Len() > 0 && t.Protocol == last.Protocol && t.HostIP == last.HostIP &&
			portOK(t.HostPort) && portOK(t.ContainerPort) {
			lastM.HostPort, lastM.ContainerPort = t.HostPort, t.ContainerPort
			ms.Add(lastM)
			return true
		}
		m, ok := plainMapping(t)
		ms.Add(m)
		last, lastM = t, m
		return ok
	})
	if !ok {
		return nc, plan.Mappings{}, false
	}
	rest := s.b
	if start >= 0 {
		rest = make([]byte, 0, len(s.b)-(end-start)+len("null"))
		rest = append(append(append(rest, s.b[:start]...), "null"...), s.b[end:]...)
	}
	if json.Unmarshal(rest, &nc) != nil {
		return netConf{}, plan.Mappings{}, false
	}
	return nc, ms, true
}

var (
	keyRuntimeConfig = []byte("runtimeConfig")
	keyPortMappings  = []byte("portMappings")
)

// findMappings walks the top-level object s reads and reads
// runtimeConfig.portMappings where it is, handing each entry to take
// (scanner.mappings); it returns the span [start, end) of their value in
// s.b (start is -1 without one).
func findMappings(s *scanner, take func(typedMapping) bool) (start, end int, ok bool) {
	start = -1
	seen := false
	ok = s.object(func(key []byte) bool {
		if !bytes.EqualFold(key, keyRuntimeConfig) {
			return s.skip(0)
		}
		if seen {
			return false // encoding/json would merge the two
		}
		seen = true
		if s.literal("null") {
			return true
		}
		var found bool
		return s.object(func(key []byte) bool {
			if !bytes.EqualFold(key, keyPortMappings) {
				return s.skip(0)
			}
			if found {
				return false
			}
			found = true
			s.space()
			start = s.i
			ok := s.mappings(take)
			end = s.i
			return ok
		})
	})
	if !ok || !s.end() {
		return -1, -1, false
	}
	return start, end, true
}

// object reads an object whose keys are plain (raw), calling value with
// the scanner at each key's value, which value reads.
func (s *scanner) object(value func(key []byte) bool) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	for {
		key, ok := s.raw()
		if !ok || !s.next(':') || !value(key) {
			return false
		}
		if s.next(',') {
			continue
		}
		return s.next('}')
	}
}

// maxDepth bounds the nesting skip follows, as encoding/json bounds its
// own (10000).
const maxDepth = 10000

// skip reads any JSON value, exactly as the grammar has it.
func (s *scanner) skip(depth int) bool {
	s.space()
	if !s.has(1) || depth > maxDepth {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		return s.skipString()
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	case c == '{':
		s.i++
		if s.next('}') {
			return true
		}
		for {
			if s.space(); !s.skipString() || !s.next(':') || !s.skip(depth+1) {
				return false
			}
			if s.next(',') {
				continue
			}
			return s.next('}')
		}
	case c == '[':
		s.i++
		if s.next(']') {
			return true
		}
		for {
			if !s.skip(depth + 1) {
				return false
			}
			if s.next(',') {
				continue
			}
			return s.next(']')
		}
	}
	return s.literal("null") || s.literal("true") || s.literal("false")
}

// skipString reads a string with any escapes JSON allows; bytes beyond
// ASCII pass as encoding/json lets them.
func (s *scanner) skipString() bool {
	if !s.has(1) || s.b[s.i] != '"' {
		return false
	}
	for j := s.i + 1; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			j++
			if j >= len(s.b) {
				return false
			}
			switch s.b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(s.b) {
					return false
				}
				for _, h := range s.b[j+1 : j+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return false
					}
				}
				j += 4
			default:
				return false
			}
		}
	}
	return false
}
