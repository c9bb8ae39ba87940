package iptables

import (
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
	"github.com/portmap-dev/portmap/pkg/xt/xttest"
)

// traceMemory follows p through m's nat table as the kernel would:
// PREROUTING or OUTPUT (local says which addresses are this host's, for
// addrtype), the jumps to user chains, MARK and DNAT, then POSTROUTING
// with the mark the packet got. It knows the matches this package
// writes; a rule with any other match does not match.
func traceMemory(m *xttest.Memory, p plan.Packet, local func(net.IP) bool) plan.Verdict {
	lines, err := m.Kernel(Table).ListTable()
	if err != nil {
		panic(err)
	}
	rules := map[string][][]string{}
	for _, l := range lines {
		if tok := xt.SplitRule(l); len(tok) > 2 && tok[0] == "-A" {
			rules[tok[1]] = append(rules[tok[1]], tok[2:])
		}
	}
	var v plan.Verdict
	var mark uint32
	var walk func(chain string, depth int) bool // true: terminal
	walk = func(chain string, depth int) bool {
		if depth > 16 {
			return false
		}
		for _, r := range rules[chain] {
			x, ok := parseMatch(r)
			if !ok || !x.matches(p, mark, local) {
				continue
			}
			switch x.target {
			case "RETURN":
				return false
			case "DNAT":
				v.DNAT = resolveTarget(x.to, p.Dport)
				return true
			case "MARK":
				mark = mark&^x.mask | x.value
			case "MASQUERADE":
				v.Masquerade = true
				return true
			case "ACCEPT", "DROP":
				return true
			default:
				if strings.HasPrefix(x.target, dnChain) && v.Chain == "" {
					v.Chain = x.target
				}
				if walk(x.target, depth+1) {
					return true
				}
			}
		}
		return false
	}
	hook := "PREROUTING"
	if p.FromHost {
		hook = "OUTPUT"
	}
	walk(hook, 0)
	if v.DNAT == "" {
		v.Chain = ""
		return v
	}
	walk("POSTROUTING", 0)
	return v
}

// match is a rule as Trace reads it.
type match struct {
	proto          string
	src, dst       *net.IPNet
	notSrc, notDst bool
	ports          [][2]int // --dport, or multiport's list: first, last
	localDst       bool
	markValue      uint32
	markMask       uint32
	target, to     string
	value, mask    uint32 // MARK --set-xmark
}

func (x match) matches(p plan.Packet, mark uint32, local func(net.IP) bool) bool {
	switch {
	case x.proto != "" && x.proto != string(p.Protocol),
		x.src != nil && x.src.Contains(p.Src) == x.notSrc,
		x.dst != nil && x.dst.Contains(p.Dst) == x.notDst,
		len(x.ports) > 0 && !slices.ContainsFunc(x.ports, func(r [2]int) bool { return r[0] <= p.Dport && p.Dport <= r[1] }),
		x.localDst && !local(p.Dst),
		x.markMask != 0 && mark&x.markMask != x.markValue:
		return false
	}
	return true
}

// parseMatch reads a rule's tokens as parseRule does, then the matches
// it leaves (negations, addrtype, mark); false for a match it does not
// know.
func parseMatch(tok []string) (match, bool) {
	r := parseRule(tok)
	x := match{proto: string(r.Proto), target: r.Jump, to: r.To}
	if r.SetXmark != "" {
		x.value, x.mask = parseMark(r.SetXmark)
	}
	addr := func(spec string, dst, neg bool) bool {
		n := parsePrefix(spec)
		if dst {
			x.dst, x.notDst = n, neg
		} else {
			x.src, x.notSrc = n, neg
		}
		return n != nil
	}
	if (r.Src != "" && !addr(r.Src, false, false)) || (r.Dst != "" && !addr(r.Dst, true, false)) {
		return x, false
	}
	for _, list := range []string{r.Dport, r.Dports} {
		for _, s := range strings.Split(list, ",") {
			if s == "" {
				continue
			}
			p, ok := parsePortRange(s, ":")
			if !ok {
				return x, false
			}
			x.ports = append(x.ports, p)
		}
	}
	m, neg := r.Matches, false
	for i := 0; i < len(m); i++ {
		arg := func() string {
			if i+1 < len(m) {
				i++
				return m[i]
			}
			return ""
		}
		switch t := m[i]; t {
		case "!":
			neg = true
			continue
		case "-s", "-d":
			if !addr(arg(), t == "-d", neg) {
				return x, false
			}
		case "-m":
			arg() // the module: its options follow
		case "--dst-type":
			x.localDst = arg() == "LOCAL"
		case "--mark":
			x.markValue, x.markMask = parseMark(arg())
		default:
			return x, false
		}
		neg = false
	}
	return x, true
}

func parsePrefix(s string) *net.IPNet {
	if !strings.Contains(s, "/") {
		if ip := net.ParseIP(s); ip != nil {
			bits := 128
			if ip.To4() != nil {
				ip, bits = ip.To4(), 32
			}
			return &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}
		}
		return nil
	}
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		return nil
	}
	return n
}

// parseMark reads "0x2000/0x2000".
func parseMark(s string) (value, mask uint32) {
	v, m, _ := strings.Cut(s, "/")
	a, _ := strconv.ParseUint(v, 0, 32)
	b, err := strconv.ParseUint(m, 0, 32)
	if err != nil {
		b = 0xffffffff
	}
	return uint32(a), uint32(b)
}
