package attach

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
			s.shape = shape{}
			if ports == 2 && which[0] != which[1] {
				s.shape = shape{ok: true, hostFirst: which[0] == 'h', t: t,
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
