package xt

import (
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
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
// rules with these (SameRules) instead of listing it.

// NativeRelease is the iptables release whose iptables-restore writes
// the rules this file writes, byte for byte.
const NativeRelease = "1.8.7"

// EncodeRule writes r's expressions as iptables-nft writes them: the
// protocol, source and destination first (in that order, as iptables
// keeps them in its ipt_entry), then the matches in the order of
// r.Args (--dport as the x_tables tcp or udp match, as iptables-nft
// 1.8.7 writes it; an entry rule's comment, then its multiport), a
// counter, and the target: DNAT, or a jump to one of chains (iptables
// itself tells a chain from a target by which exists; the caller knows
// its chains). It returns the protocol for NFTA_RULE_COMPAT, and
// ErrNotNative for what it does not write: other matches (conditions,
// the shared rules'), SCTP, any other target.
func EncodeRule(f plan.Family, r Rule, chains map[string]bool) (exprs []byte, proto uint8, compat bool, err error) {
	if len(r.Matches) > 0 || r.Ct != (Conntrack{}) || r.SetXmark != "" {
		return nil, 0, false, ErrNotNative
	}
	if r.Proto != "" {
		if proto = protoOf(string(r.Proto)); proto == 0 {
			return nil, 0, false, ErrNotNative
		}
	}
	var list nfnl.Attrs
	l := nft.List{To: &list}
	if proto != 0 {
		l.Meta(unix.NFT_META_L4PROTO, unix.NFT_REG_1)
		l.Cmp(unix.NFT_CMP_EQ, unix.NFT_REG_1, []byte{proto})
	}
	for _, a := range []struct {
		spec string
		dst  bool
	}{{r.Src, false}, {r.Dst, true}} {
		if a.spec == "" {
			continue
		}
		n, err := ipNet(f, a.spec)
		if err != nil {
			return nil, 0, false, err
		}
		if !n.IP.IsUnspecified() || !isZero(n.Mask) { // every address: iptables writes no match
			addrMatch(l, f, a.dst, n)
		}
	}
	comment := func() error {
		if r.Comment == "" {
			return nil
		}
		if len(r.Comment) >= commentLen {
			return ErrNotNative
		}
		info := make([]byte, commentLen)
		copy(info, r.Comment)
		l.Match("comment", 0, info)
		compat = true
		return nil
	}
	switch {
	case r.Dports != "":
		if err := comment(); err != nil {
			return nil, 0, false, err
		}
		info, ok := MultiportInfo(r.Dports)
		if !ok || proto == 0 {
			return nil, 0, false, ErrNotNative
		}
		l.Match("multiport", 1, info)
		compat = true
	default:
		if r.Dport != "" {
			first, last, ok := portSpan(r.Dport, ":")
			name := map[uint8]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[proto]
			if !ok || name == "" {
				return nil, 0, false, ErrNotNative
			}
			l.Match(name, 0, portInfo(first, last))
			compat = true
		}
		if err := comment(); err != nil {
			return nil, 0, false, err
		}
	}
	l.Counter()
	switch {
	case r.Jump == "DNAT":
		info, ok := NatRange2(f, r.To)
		if !ok {
			return nil, 0, false, ErrNotNative
		}
		l.Target("DNAT", 2, info)
		compat = true
	case chains[r.Jump] && r.To == "":
		l.Verdict(unix.NFT_JUMP, r.Jump)
	default:
		return nil, 0, false, ErrNotNative // a target of x_tables, or another chain
	}
	return list.Bytes(), proto, compat, nil
}

// ruleMsg is the NEWRULE message of r in the nat table of family f:
// appended to its chain, or at its top for an Insert rule.
func ruleMsg(f plan.Family, r Rule, chains map[string]bool) (nfnl.Msg, error) {
	exprs, proto, compat, err := EncodeRule(f, r, chains)
	if err != nil {
		return nfnl.Msg{}, err
	}
	var a nfnl.Attrs
	a.String(unix.NFTA_RULE_TABLE, NAT).String(unix.NFTA_RULE_CHAIN, r.Chain)
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
	return nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_NEWRULE), Flags: flags, Family: nft.Family(f).Proto(), Attrs: a.Bytes()}, nil
}

// AddChainMsgs is ADD's fast path as one nf_tables transaction: flush
// marker (which fails unless it exists), create chain (which fails if
// it exists), append its rules, insert the entry rules (entries, which
// must be Insert rules, in their order at the top) — in the order and
// with the outcome of addPayload's restore. It fails with
// ErrNotNative when a rule is not one EncodeRule writes; its rules may
// jump to chain and to jumps.
func AddChainMsgs(f plan.Family, marker, chain string, rules, entries []Rule, jumps ...string) ([]nfnl.Msg, error) {
	chains := JumpSet(chain, jumps)
	var msgs []nfnl.Msg
	if marker != "" {
		var flush nfnl.Attrs
		flush.String(unix.NFTA_RULE_TABLE, NAT).String(unix.NFTA_RULE_CHAIN, marker)
		msgs = append(msgs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_DELRULE), Family: nft.Family(f).Proto(), Attrs: flush.Bytes()})
	}
	var c nfnl.Attrs
	c.String(unix.NFTA_CHAIN_TABLE, NAT).String(unix.NFTA_CHAIN_NAME, chain)
	msgs = append(msgs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_NEWCHAIN), Flags: unix.NLM_F_CREATE | unix.NLM_F_EXCL, Family: nft.Family(f).Proto(), Attrs: c.Bytes()})
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

// JumpSet is the chains rules may jump to: chain and jumps.
func JumpSet(chain string, jumps []string) map[string]bool {
	chains := map[string]bool{chain: true}
	for _, j := range jumps {
		chains[j] = true
	}
	return chains
}

// NativeExprs is what nf_tables holds for a rule of chain spelled args
// (iptables -S tokens after the chain) that may jump to jumps, as the
// native writer writes it in either family; ErrNotNative for a rule
// it does not write. xttest's kernel judges and answers with it.
func NativeExprs(chain string, args, jumps []string) ([]byte, error) {
	r := ParseRule(args)
	r.Chain = chain
	var err error
	for _, f := range plan.Families {
		var e []byte
		if e, _, _, err = EncodeRule(f, r, JumpSet(chain, jumps)); err == nil {
			return e, nil
		}
	}
	return nil, err
}
