package iptables

import (
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfexpr"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// ADD's fast path without iptables-restore. iptables-nft keeps its nat
// table in nf_tables, and the rules an attachment without conditions
// has are few in kind: this file writes them as iptables-nft 1.8.7 does
// — the same expressions, byte for byte as the kernel holds them, which
// the kernel tests compare with what that release's iptables-restore
// writes — in one transaction that reads nothing, and saves ADD the process (2.4 ms of
// 7.2 beside one attachment here). iptables -S, iptables-save and -D by
// rule read the rules as their own.
//
// Why 1.8.7's encoding and not the node's: the releases after it write
// some matches as nf_tables expressions of their own (1.8.9: --dport as a
// payload comparison; 1.8.11: -p as the IP header's protocol field), and
// a release before that cannot read them: iptables 1.8.7 lists a 1.8.9
// --dport rule without its port, and an iptables-save | iptables-restore
// round trip then forwards every port of the protocol. Every release from
// 1.8.7 to 1.8.11 reads 1.8.7's x_tables matches as the same rule, and a
// node's tables are read by more than one release (the host's, a
// kube-proxy image's, a firewall's): so the fast path writes what all of
// them read (test/compat holds each release to it). What still grows with the
// attachments is the kernel's: a jump added makes the commit validate
// every chain a base chain reaches (0.16 ms beside one attachment, 5 ms
// beside 1000), as it did for the restore. CHECK compares a chain's
// rules with these (sameRules) instead of listing it.

// NativeRelease is the iptables release whose iptables-restore writes
// the rules this file writes, byte for byte.
const NativeRelease = "1.8.7"

// errNotNative says a rule holds a token encodeRule does not write;
// the caller uses iptables-restore.
var errNotNative = errors.New("not encoded natively")

// Match and target structs of x_tables as the kernel's modules read them
// (nft_compat hands them over as they are).
const (
	commentLen     = 256 // struct xt_comment_info
	multiportLen   = 48  // struct xt_multiport_v1
	portInfoLen    = 16  // struct xt_tcp, struct xt_udp
	natRange2Len   = 48  // struct nf_nat_range2, aligned as x_tables aligns
	multiportDest  = 1   // XT_MULTIPORT_DESTINATION
	natMapIPs      = 0x01
	natProtoSpec   = 0x02
	natProtoOffset = 0x20
)

// ruleSpec is a rule of ours, read from its tokens.
type ruleSpec struct {
	proto    uint8
	src, dst *net.IPNet
	matches  []func(*nfnl.Attrs) // in the order of the tokens
	compat   bool                // holds an x_tables match or target
	target   func(*nfnl.Attrs)
}

// encodeRule writes r's expressions as iptables-nft writes them: the
// protocol, source and destination first (in that order, as iptables
// keeps them in its ipt_entry), then the matches in the order of the
// tokens (--dport as the x_tables tcp or udp match, as iptables-nft
// 1.8.7 writes it), a counter, and the target: DNAT, or a jump
// to one of chains (iptables itself tells a chain from a target by
// which exists; the caller knows its chains). It returns the
// protocol for NFTA_RULE_COMPAT, and errNotNative for a token it does
// not know: conditions, SCTP, any other target.
func encodeRule(f plan.Family, r Rule, chains map[string]bool) (exprs []byte, proto uint8, compat bool, err error) {
	s, err := readRule(f, r.Args, chains)
	if err != nil {
		return nil, 0, false, err
	}
	var list nfnl.Attrs
	if s.proto != 0 {
		nfexpr.Meta(&list, unix.NFT_META_L4PROTO, unix.NFT_REG_1)
		nfexpr.Cmp(&list, unix.NFT_CMP_EQ, unix.NFT_REG_1, []byte{s.proto})
	}
	for i, n := range []*net.IPNet{s.src, s.dst} {
		if n != nil {
			addrMatch(&list, f, i == 1, n)
		}
	}
	for _, m := range s.matches {
		m(&list)
	}
	nfexpr.Counter(&list)
	s.target(&list)
	return list.Bytes(), s.proto, s.compat, nil
}

func readRule(f plan.Family, args []string, chains map[string]bool) (*ruleSpec, error) {
	s := &ruleSpec{}
	next := func(i int) (string, error) {
		if i+1 >= len(args) {
			return "", errNotNative
		}
		return args[i+1], nil
	}
	for i := 0; i < len(args); i += 2 {
		v, err := next(i)
		if err != nil {
			return nil, err
		}
		switch args[i] {
		case "-p":
			if s.proto = protoOf(v); s.proto == 0 {
				return nil, errNotNative
			}
		case "-s", "-d":
			n, err := ipNet(f, v)
			if err != nil {
				return nil, err
			}
			if n.IP.IsUnspecified() && isZero(n.Mask) {
				continue // every address: iptables writes no match
			}
			if args[i] == "-s" {
				s.src = n
			} else {
				s.dst = n
			}
		case "--dport":
			first, last, ok := portSpan(v, ":")
			if !ok || s.proto == 0 {
				return nil, errNotNative
			}
			name := map[uint8]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[s.proto]
			info := portInfo(first, last)
			s.matches = append(s.matches, func(l *nfnl.Attrs) { nfexpr.Match(l, name, 0, info) })
			s.compat = true
		case "-m":
			switch v {
			case "comment":
				if i+3 >= len(args) || args[i+2] != "--comment" || len(args[i+3]) >= commentLen {
					return nil, errNotNative
				}
				info := make([]byte, commentLen)
				copy(info, args[i+3])
				s.matches = append(s.matches, func(l *nfnl.Attrs) { nfexpr.Match(l, "comment", 0, info) })
				s.compat = true
				i += 2
			case "multiport":
				// "-m multiport [-p P] --destination-ports LIST": -p is
				// read as itself, before the list
				j := i + 2
				if j+1 < len(args) && args[j] == "-p" {
					if s.proto = protoOf(args[j+1]); s.proto == 0 {
						return nil, errNotNative
					}
					j += 2
				}
				if j+1 >= len(args) || args[j] != "--destination-ports" || s.proto == 0 {
					return nil, errNotNative
				}
				info, ok := multiportInfo(args[j+1])
				if !ok {
					return nil, errNotNative
				}
				s.matches = append(s.matches, func(l *nfnl.Attrs) { nfexpr.Match(l, "multiport", 1, info) })
				s.compat = true
				i = j
			default:
				return nil, errNotNative
			}
		case "-j":
			if s.target != nil {
				return nil, errNotNative
			}
			if v != "DNAT" {
				if !chains[v] {
					return nil, errNotNative // a target of x_tables, or another chain
				}
				s.target = func(l *nfnl.Attrs) { nfexpr.Immediate(l, unix.NFT_JUMP, v) }
				continue
			}
			if i+3 >= len(args) || args[i+2] != "--to-destination" {
				return nil, errNotNative
			}
			info, ok := natRange2(f, args[i+3])
			if !ok {
				return nil, errNotNative
			}
			s.target = func(l *nfnl.Attrs) { nfexpr.Target(l, "DNAT", 2, info) }
			s.compat = true
			i += 2
		default:
			return nil, errNotNative
		}
	}
	if s.target == nil {
		return nil, errNotNative
	}
	return s, nil
}

func protoOf(v string) uint8 {
	switch plan.Protocol(v) {
	case plan.TCP:
		return unix.IPPROTO_TCP
	case plan.UDP:
		return unix.IPPROTO_UDP
	}
	return 0 // SCTP: iptables-nft writes its x_tables match
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// ipNet reads an address or prefix of family f.
func ipNet(f plan.Family, v string) (*net.IPNet, error) {
	if !strings.Contains(v, "/") {
		ip := net.ParseIP(v)
		if ip == nil {
			return nil, errNotNative
		}
		bits := 128
		if f == plan.IPv4 {
			bits = 32
		}
		v = ip.String() + "/" + strconv.Itoa(bits)
	}
	_, n, err := net.ParseCIDR(v)
	if err != nil || (n.IP.To4() != nil) != (f == plan.IPv4) {
		return nil, errNotNative
	}
	if f == plan.IPv4 {
		n.IP = n.IP.To4()
	}
	return n, nil
}

// addrMatch compares the source (or destination) address with n as
// iptables-nft does: the prefix's whole bytes alone when its mask ends
// on a byte, else the whole address through a mask.
func addrMatch(l *nfnl.Attrs, f plan.Family, dst bool, n *net.IPNet) {
	off, length := addrOffset(f, dst)
	whole := 0
	for whole < len(n.Mask) && n.Mask[whole] == 0xff {
		whole++
	}
	if isZero(n.Mask[whole:]) {
		nfexpr.Payload(l, unix.NFT_PAYLOAD_NETWORK_HEADER, off, uint32(whole), unix.NFT_REG_1)
		nfexpr.Cmp(l, unix.NFT_CMP_EQ, unix.NFT_REG_1, n.IP[:whole])
		return
	}
	nfexpr.Payload(l, unix.NFT_PAYLOAD_NETWORK_HEADER, off, length, unix.NFT_REG_1)
	nfexpr.Bitwise(l, unix.NFT_REG_1, n.Mask, make([]byte, len(n.Mask)))
	nfexpr.Cmp(l, unix.NFT_CMP_EQ, unix.NFT_REG_1, n.IP)
}

// addrOffset is where the source or destination address sits in the
// family's network header, and its length.
func addrOffset(f plan.Family, dst bool) (offset, length uint32) {
	switch {
	case f == plan.IPv6 && dst:
		return 24, 16
	case f == plan.IPv6:
		return 8, 16
	case dst:
		return 16, 4
	}
	return 12, 4
}

// portInfo is the tcp or udp match's struct for --dport first[:last]
// (struct xt_tcp, whose leading fields struct xt_udp shares: source
// ports, destination ports, in host order; the rest zero), as long as
// iptables hands it over (XT_ALIGN of struct xt_tcp).
func portInfo(first, last int) []byte {
	info := make([]byte, portInfoLen)
	binary.NativeEndian.PutUint16(info[2:], 0xffff) // any source port
	binary.NativeEndian.PutUint16(info[4:], uint16(first))
	binary.NativeEndian.PutUint16(info[6:], uint16(last))
	return info
}

// portSpan reads "port" or "first<sep>last".
func portSpan(v, sep string) (first, last int, ok bool) {
	a, b, isRange := strings.Cut(v, sep)
	first, err := strconv.Atoi(a)
	if err != nil || first < 0 || first > 65535 {
		return 0, 0, false
	}
	if !isRange {
		return first, first, true
	}
	last, err = strconv.Atoi(b)
	if err != nil || last < first || last > 65535 {
		return 0, 0, false
	}
	return first, last, true
}

// multiportInfo is struct xt_multiport_v1 for destination ports list
// ("80,8000:8010"): each port one slot, a range two, at most 15.
func multiportInfo(list string) ([]byte, bool) {
	info := make([]byte, multiportLen)
	info[0] = multiportDest
	n := 0
	for _, spec := range strings.Split(list, ",") {
		first, last, ok := portSpan(spec, ":")
		if !ok || n+multiportSlots(spec) > maxMultiport {
			return nil, false
		}
		binary.NativeEndian.PutUint16(info[2+2*n:], uint16(first))
		if strings.Contains(spec, ":") {
			info[32+n] = 1 // pflags: a range starts here
			n++
			binary.NativeEndian.PutUint16(info[2+2*n:], uint16(last))
		}
		n++
	}
	info[1] = byte(n)
	return info, true
}

// natRange2 is struct nf_nat_range2 for DNAT's --to-destination as we
// write it: "addr", "addr:port", "addr:first-last/base" ("[v6]:…").
func natRange2(f plan.Family, to string) ([]byte, bool) {
	host, ports := to, ""
	if strings.HasPrefix(to, "[") {
		end := strings.Index(to, "]")
		if end < 0 {
			return nil, false
		}
		host, ports = to[1:end], strings.TrimPrefix(to[end+1:], ":")
	} else if f == plan.IPv4 {
		host, ports, _ = strings.Cut(to, ":")
	}
	ip := net.ParseIP(host)
	if ip == nil || (ip.To4() != nil) != (f == plan.IPv4) {
		return nil, false
	}
	if f == plan.IPv4 {
		ip = ip.To4()
	}
	info := make([]byte, natRange2Len)
	flags := uint32(natMapIPs)
	copy(info[4:], ip)
	copy(info[20:], ip)
	if ports != "" {
		span, base, hasBase := strings.Cut(ports, "/")
		first, last, ok := portSpan(span, "-")
		if !ok {
			return nil, false
		}
		flags |= natProtoSpec
		binary.BigEndian.PutUint16(info[36:], uint16(first))
		binary.BigEndian.PutUint16(info[38:], uint16(last))
		if hasBase {
			b, err := strconv.Atoi(base)
			if err != nil || b < 0 || b > 65535 {
				return nil, false
			}
			flags |= natProtoOffset
			binary.BigEndian.PutUint16(info[40:], uint16(b))
		}
	}
	binary.NativeEndian.PutUint32(info, flags)
	return info, true
}

// ruleMsg is the NEWRULE message of r in the nat table of family f:
// appended to its chain, or at its top for an Insert rule.
func ruleMsg(f plan.Family, r Rule, chains map[string]bool) (nfnl.Msg, error) {
	exprs, proto, compat, err := encodeRule(f, r, chains)
	if err != nil {
		return nfnl.Msg{}, err
	}
	var a nfnl.Attrs
	a.String(unix.NFTA_RULE_TABLE, Table).String(unix.NFTA_RULE_CHAIN, r.Chain)
	a.Raw(unix.NFTA_RULE_EXPRESSIONS|unix.NLA_F_NESTED, exprs)
	if compat && proto != 0 {
		// what an x_tables match or target checks the protocol against
		a.Nested(unix.NFTA_RULE_COMPAT, func(a *nfnl.Attrs) {
			a.U32(unix.NFTA_RULE_COMPAT_PROTO, uint32(proto))
			a.U32(unix.NFTA_RULE_COMPAT_FLAGS, 0)
		})
	}
	flags := uint16(unix.NLM_F_CREATE | unix.NLM_F_APPEND)
	if r.Insert {
		flags = unix.NLM_F_CREATE // no position: the kernel puts it first
	}
	return nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_NEWRULE), Flags: flags, Family: nfproto(f), Attrs: a.Bytes()}, nil
}

// addChainMsgs is ADD's fast path as one nf_tables transaction: flush
// witness (which fails unless it exists), create chain (which fails if
// it exists), append its rules, insert the entry rules (entries, which
// must be Insert rules, in their order at the top) — in the order and
// with the outcome of addPayload's restore. It fails with
// errNotNative when a rule is not one encodeRule writes; its rules may
// jump to chain and to jumps.
func addChainMsgs(f plan.Family, witness, chain string, rules, entries []Rule, jumps ...string) ([]nfnl.Msg, error) {
	chains := jumpSet(chain, jumps)
	var msgs []nfnl.Msg
	if witness != "" {
		var flush nfnl.Attrs
		flush.String(unix.NFTA_RULE_TABLE, Table).String(unix.NFTA_RULE_CHAIN, witness)
		msgs = append(msgs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_DELRULE), Family: nfproto(f), Attrs: flush.Bytes()})
	}
	var c nfnl.Attrs
	c.String(unix.NFTA_CHAIN_TABLE, Table).String(unix.NFTA_CHAIN_NAME, chain)
	msgs = append(msgs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_NEWCHAIN), Flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, Family: nfproto(f), Attrs: c.Bytes()})
	// the entries each go to the top: in reverse, so they keep their
	// order (fillChain)
	all := append([]Rule(nil), rules...)
	for i := len(entries) - 1; i >= 0; i-- {
		all = append(all, entries[i])
	}
	for _, r := range all {
		m, err := ruleMsg(f, r, chains)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// jumpSet is the chains rules may jump to: chain and jumps.
func jumpSet(chain string, jumps []string) map[string]bool {
	chains := map[string]bool{chain: true}
	for _, j := range jumps {
		chains[j] = true
	}
	return chains
}

// exprForm is an expression as CHECK compares it: its name and its
// attributes by path ("3", "2.2.1"). The kernel dumps a rule in its own
// order of attributes and without the nested flag, and the counter's
// values are the traffic's: so neither order nor flags count, and a
// counter is its name.
type exprForm struct {
	name  string
	attrs map[string]string
}

// nestedAttrs are the paths of the attributes that hold attributes, by
// expression (the dump does not flag them).
var nestedAttrs = map[string]map[string]bool{
	"cmp":       {"3": true},              // NFTA_CMP_DATA
	"range":     {"3": true, "4": true},   // NFTA_RANGE_FROM_DATA, _TO_DATA
	"bitwise":   {"4": true, "5": true},   // NFTA_BITWISE_MASK, _XOR
	"immediate": {"2": true, "2.2": true}, // NFTA_IMMEDIATE_DATA, its NFTA_DATA_VERDICT
	"counter":   {},
}

// dumpDefaults are attributes the kernel dumps that the rules we write
// leave at their default: bitwise's operation (NFTA_BITWISE_OP, boolean).
var dumpDefaults = map[string]map[string]string{
	"bitwise": {"6": "\x00\x00\x00\x00"},
}

func exprForms(list []byte) []exprForm {
	var out []exprForm
	for el := range nfnl.All(list) {
		f := exprForm{attrs: map[string]string{}}
		var data []byte
		for a := range nfnl.All(el.Value) {
			switch a.Type {
			case unix.NFTA_EXPR_NAME:
				f.name = a.String()
			case unix.NFTA_EXPR_DATA:
				data = a.Value
			}
		}
		if f.name != "counter" {
			flatten(f.attrs, "", data, nestedAttrs[f.name])
		}
		out = append(out, f)
	}
	return out
}

func flatten(m map[string]string, prefix string, b []byte, nested map[string]bool) {
	for a := range nfnl.All(b) {
		p := prefix + strconv.Itoa(int(a.Type))
		if nested[p] {
			flatten(m, p+".", a.Value, nested)
			continue
		}
		m[p] = string(a.Value)
	}
}

// sameExprs reports whether the kernel's dump of a rule's expressions
// is the rule we write as want.
func sameExprs(dumped, want []byte) bool {
	got, exp := exprForms(dumped), exprForms(want)
	if len(got) != len(exp) {
		return false
	}
	for i, g := range got {
		e := exp[i]
		if g.name != e.name {
			return false
		}
		for p, v := range e.attrs {
			if g.attrs[p] != v {
				return false
			}
		}
		for p, v := range g.attrs {
			if _, ok := e.attrs[p]; !ok && dumpDefaults[g.name][p] != v {
				return false
			}
		}
	}
	return true
}

// sameRules reports whether the kernel's dump of a chain's rules
// (NFTA_RULE_EXPRESSIONS of each) holds rules, in order, as encodeRule
// writes them; errNotNative when one of rules is not one it writes.
func sameRules(f plan.Family, dumped [][]byte, rules []Rule, chains map[string]bool) (bool, error) {
	want := make([][]byte, len(rules))
	for i, r := range rules {
		e, _, _, err := encodeRule(f, r, chains)
		if err != nil {
			return false, err
		}
		want[i] = e
	}
	if len(dumped) != len(want) {
		return false, nil
	}
	for i := range want {
		if !sameExprs(dumped[i], want[i]) {
			return false, nil
		}
	}
	return true, nil
}
