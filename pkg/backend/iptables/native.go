package iptables

import (
	"errors"
	"net"

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
