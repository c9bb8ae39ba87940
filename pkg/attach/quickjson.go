package attach

import (
	"slices"
	"strconv"
)

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
	// where the ports are, for the shape of the next entry
	var at [2][2]int
	var which [2]byte
	ports := 0
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
			if ports < 2 {
				at[ports], which[ports] = [2]int{i, k}, key[0]
			}
			ports++
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
			s.shape = shape{next: s.shape.next[:0]}
			if ports == 2 && which[0] != which[1] {
				s.shape = shape{ok: true, hostFirst: which[0] == 'h', t: t, next: s.shape.next,
					lit: [3][]byte{b[s.i:at[0][0]], b[at[0][1]:at[1][0]], b[at[1][1] : i+1]}}
			}
			s.i = i + 1
			return t, true
		default:
			return t, false
		}
	}
}

// shape is the last entry quickMapping read, its two ports cut out: an
// entry of a range differs from the one before it in its ports alone, so
// the next is first compared with it byte for byte around them.
type shape struct {
	ok        bool
	lit       [3][]byte // before the first port, between them, after the second
	hostFirst bool      // the first port is hostPort
	t         typedMapping

	// next, once two entries in a row had both ports one up, is the
	// entry that would continue them, spelled as they were: the third
	// entry of a range on is then one comparison (continued). digits
	// are where its two ports are in it.
	next   []byte
	digits [2][2]int
}

// spellNext makes next the entry of the shape whose ports are first and
// second, in the order written; false when a port would be above 65535.
func (sh *shape) spellNext(first, second int) bool {
	if first > 65535 || second > 65535 {
		sh.next = sh.next[:0]
		return false
	}
	b := append(sh.next[:0], sh.lit[0]...)
	sh.digits[0][0] = len(b)
	b = strconv.AppendInt(b, int64(first), 10)
	sh.digits[0][1] = len(b)
	b = append(b, sh.lit[1]...)
	sh.digits[1][0] = len(b)
	b = strconv.AppendInt(b, int64(second), 10)
	sh.digits[1][1] = len(b)
	sh.next = append(b, sh.lit[2]...)
	return true
}

// continued reads the entry at the scanner if it is next: the last
// entry with both ports one up. Every entry of a range from its third
// on is, so a range costs one comparison an entry.
func (s *scanner) continued() (t typedMapping, ok bool) {
	if !s.continuedOne() {
		return t, false
	}
	return s.shape.t, true
}

// continuedRun reads, when the scanner has more, the entries from the
// scanner on that each continue the one before (continued), with the
// commas between them, and says how many; it stops after the last.
func (s *scanner) continuedRun() int {
	if s.more == nil {
		return 0
	}
	defer func() { s.open = false }() // what was not let go stays in b
	n := 0
	for len(s.shape.next) > 0 {
		need := 1 + len(s.shape.next)
		if len(s.b)-s.i < need {
			s.letGo()
			s.has(need)
		}
		if n > 0 {
			if k := s.tight(); k > 0 {
				n += k
				continue
			}
		}
		s.open = false
		at := s.i
		if n > 0 && !s.next(',') {
			return n
		}
		s.space()
		if !s.continuedOne() {
			s.i = at
			return n
		}
		n++
	}
	return n
}

// continuedOne is continued, without the entry: the shape has it.
func (s *scanner) continuedOne() bool {
	sh := &s.shape
	n := len(sh.next)
	if n == 0 || len(s.b)-s.i < n || string(s.b[s.i:s.i+n]) != string(sh.next) {
		return false
	}
	s.i += n
	sh.advance()
	return true
}

// advance makes the shape's entry the one it spelled next, and spells
// the one after: both ports one up again, in place while no port gains
// a digit.
func (sh *shape) advance() {
	sh.t.HostPort++
	sh.t.ContainerPort++
	// most often neither port ends in a 9
	if a, b := sh.digits[0][1]-1, sh.digits[1][1]-1; sh.next[a] != '9' && sh.next[b] != '9' {
		sh.next[a]++
		sh.next[b]++
		if sh.t.HostPort >= 65535 || sh.t.ContainerPort >= 65535 {
			sh.next = sh.next[:0]
		}
		return
	}
	for _, d := range sh.digits {
		k := d[1] - 1
		for k >= d[0] && sh.next[k] == '9' {
			sh.next[k] = '0'
			k--
		}
		if k < d[0] {
			first, second := sh.t.HostPort+1, sh.t.ContainerPort+1
			if !sh.hostFirst {
				first, second = second, first
			}
			sh.spellNext(first, second)
			return
		}
		sh.next[k]++
	}
	if sh.t.HostPort+1 > 65535 || sh.t.ContainerPort+1 > 65535 {
		sh.next = sh.next[:0]
	}
}

// clone is sh with a spelling of its own.
func (sh *shape) clone() shape {
	c := *sh
	c.next = slices.Clone(sh.next)
	return c
}

// shaped reads the entry at the scanner if it is the last one's shape
// with other ports (of one to five digits, the first not 0): what
// quickMapping would read of it, for a few comparisons.
func (s *scanner) shaped() (t typedMapping, ok bool) {
	sh := &s.shape
	if !sh.ok {
		return t, false
	}
	b, i := s.b, s.i
	var ports [2]int
	for n, l := range sh.lit {
		if len(b)-i < len(l) || string(b[i:i+len(l)]) != string(l) {
			return t, false
		}
		if i += len(l); n == 2 {
			break
		}
		v, k := 0, i
		for k < len(b) && k-i < 5 && b[k] >= '0' && b[k] <= '9' {
			v = v*10 + int(b[k]-'0')
			k++
		}
		// what follows must be the next literal, which starts with no
		// digit: a sixth digit, a fraction or an exponent fails there
		if k == i || b[i] == '0' {
			return t, false
		}
		ports[n], i = v, k
	}
	t = sh.t
	t.HostPort, t.ContainerPort = ports[0], ports[1]
	if !sh.hostFirst {
		t.HostPort, t.ContainerPort = ports[1], ports[0]
	}
	s.i = i
	// the second entry of a range: the third is then spelled ahead
	if t.HostPort == sh.t.HostPort+1 && t.ContainerPort == sh.t.ContainerPort+1 {
		sh.spellNext(ports[0]+1, ports[1]+1)
	} else {
		sh.next = sh.next[:0]
	}
	sh.t = t
	return t, true
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
