package xttest

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// Verdict is what the nat table did to a packet.
type Verdict struct {
	// Chains are the user chains it jumped or went to, in order.
	Chains []string
	// DNAT is where a DNAT target sent it ("192.0.2.2:80"); "" when none
	// did.
	DNAT string
	// Masquerade is true when POSTROUTING masquerades it.
	Masquerade bool
	// Dropped is true when a rule dropped it.
	Dropped bool
}

// Trace runs p, the first packet of a connection, through the nat table
// as the kernel would: PREROUTING (OUTPUT for one of this host), the jumps to user chains, MARK and DNAT, then POSTROUTING
// with the mark the packet got. local says which addresses are this
// host's (-m addrtype --dst-type LOCAL). It knows the matches of
// protocol, ports (multiport too), addresses (negated too), addrtype,
// mark and comment, and the targets of a chain, RETURN, ACCEPT, DROP,
// MARK, DNAT and MASQUERADE; a rule with anything else fails it, named.
func (m *Memory) Trace(p plan.Packet, local func(net.IP) bool) (Verdict, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	tr := &tracer{t: m.table(xt.NAT), p: p, local: local}
	hook := "PREROUTING"
	if p.FromHost {
		hook = "OUTPUT"
	}
	for _, h := range []string{hook, "POSTROUTING"} {
		if _, err := tr.walk(h, 0); err != nil || tr.v.Dropped {
			return tr.v, err
		}
	}
	return tr.v, nil
}

type tracer struct {
	t     *xtable
	p     plan.Packet
	local func(net.IP) bool
	mark  uint32
	v     Verdict
}

// walk runs chain's rules; true when one ended the packet's way through
// the table (ACCEPT, DROP, DNAT, MASQUERADE), false at RETURN or the
// chain's end.
func (tr *tracer) walk(chain string, depth int) (bool, error) {
	if depth > 16 {
		return false, fmt.Errorf("chain %s: jumps nested deeper than 16", chain)
	}
	for i, r := range tr.t.rules[chain] {
		x, err := parseMatch(r)
		if err != nil {
			return false, fmt.Errorf("rule %d of %s: %w", i+1, chain, err)
		}
		if !x.matches(tr.p, tr.mark, tr.local) {
			continue
		}
		switch x.target {
		case "":
		case "RETURN":
			return false, nil
		case "DNAT":
			tr.v.DNAT = xt.ResolveDNAT(x.to, tr.p.Dport)
			return true, nil
		case "MARK":
			tr.mark = tr.mark&^x.mask | x.value
		case "MASQUERADE":
			tr.v.Masquerade = true
			return true, nil
		case "ACCEPT":
			return true, nil
		case "DROP":
			tr.v.Dropped = true
			return true, nil
		default:
			if xt.Targets[x.target] || !tr.t.has(x.target) {
				return false, fmt.Errorf("rule %d of %s: target %s", i+1, chain, x.target)
			}
			tr.v.Chains = append(tr.v.Chains, x.target)
			if done, err := tr.walk(x.target, depth+1); done || err != nil {
				return done, err
			}
		}
	}
	return false, nil
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

// parseMatch reads a rule's tokens as xt.ParseRule does, then the
// matches it leaves (negations, addrtype, mark).
func parseMatch(tok []string) (match, error) {
	r := xt.ParseRule(tok)
	x := match{proto: string(r.Proto), target: r.Jump, to: r.To}
	if r.SetXmark != "" {
		x.value, x.mask = parseMark(r.SetXmark)
	}
	addr := func(spec string, dst, neg bool) error {
		n := parsePrefix(spec)
		if dst {
			x.dst, x.notDst = n, neg
		} else {
			x.src, x.notSrc = n, neg
		}
		if n == nil {
			return fmt.Errorf("address %q", spec)
		}
		return nil
	}
	if r.Src != "" {
		if err := addr(r.Src, false, false); err != nil {
			return x, err
		}
	}
	if r.Dst != "" {
		if err := addr(r.Dst, true, false); err != nil {
			return x, err
		}
	}
	for _, list := range []string{r.Dport, r.Dports} {
		for _, s := range strings.Split(list, ",") {
			if s == "" {
				continue
			}
			p, ok := xt.PortRange(s, ":")
			if !ok {
				return x, fmt.Errorf("port %q", s)
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
			if err := addr(arg(), t == "-d", neg); err != nil {
				return x, err
			}
		case "-m":
			arg() // the module: its options follow
		case "--dst-type":
			x.localDst = arg() == "LOCAL"
		case "--mark":
			x.markValue, x.markMask = parseMark(arg())
		default:
			return x, fmt.Errorf("a match the tracer does not know: %s", t)
		}
		neg = false
	}
	return x, nil
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
