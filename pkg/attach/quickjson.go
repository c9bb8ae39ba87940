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
