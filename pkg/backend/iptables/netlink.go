package iptables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// ErrLegacy says this network namespace has an iptables-legacy table:
// its rules are not nf_tables', and only the tools reach them.
var ErrLegacy = errors.New("iptables-legacy table in use: not reachable over nf_tables netlink")

// legacyTable reports whether iptables-legacy's table of family f exists
// in this thread's network namespace: x_tables lists the tables it holds
// in ip_tables_names (ip6_tables_names). Without one, whatever iptables
// made here lives in nf_tables (iptables-nft: tables "ip nat", "ip6
// nat"), or does not exist. It asks the kernel, not the tool's name: a
// tool called iptables-restore may be either.
func legacyTable(f plan.Family, table string) bool {
	name := "/proc/thread-self/net/ip_tables_names"
	if f == plan.IPv6 {
		name = "/proc/thread-self/net/ip6_tables_names"
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return false // x_tables not loaded: no legacy table anywhere
	}
	return slices.Contains(strings.Fields(string(b)), table)
}

func nfproto(f plan.Family) uint8 {
	if f == plan.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// chainExists asks nf_tables whether the nat table of family f has chain.
func chainExists(c *nfnl.Conn, f plan.Family, chain string) (bool, error) {
	var get nfnl.Attrs
	get.String(unix.NFTA_CHAIN_TABLE, Table).String(unix.NFTA_CHAIN_NAME, chain)
	_, err := c.GetOne(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETCHAIN), Family: nfproto(f), Attrs: get.Bytes()})
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get chain %s: %w", chain, err)
	}
	return true, nil
}

// summarize reads chains of table of family f: a get of each chain (the
// kernel answers ENOENT for a missing chain or table; its use count is
// the chain's rules and the rules that jump to it) and, withRules, a
// dump of its rules alone (the kernel looks the chain up by name: other
// chains are not read).
func summarize(c *nfnl.Conn, f plan.Family, table string, names []string, withRules bool) (map[string]ChainSummary, error) {
	out := map[string]ChainSummary{}
	for _, name := range names {
		var get nfnl.Attrs
		get.String(unix.NFTA_CHAIN_TABLE, table).String(unix.NFTA_CHAIN_NAME, name)
		reply, err := c.GetOne(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETCHAIN), Family: nfproto(f), Attrs: get.Bytes()})
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get chain %s of table %s: %w", name, table, err)
		}
		// The chain's use count: its own rules and the rules that jump to it.
		var use int
		if v, ok := nfnl.Find(reply.Attrs, unix.NFTA_CHAIN_USE); ok && len(v) == 4 {
			use = int(binary.BigEndian.Uint32(v))
		}
		if !withRules {
			out[name] = ChainSummary{}
			continue
		}
		var dump nfnl.Attrs
		dump.String(unix.NFTA_RULE_TABLE, table).String(unix.NFTA_RULE_CHAIN, name)
		rules, err := c.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETRULE), Family: nfproto(f), Attrs: dump.Bytes()})
		if err != nil {
			return nil, fmt.Errorf("list rules of %s of table %s: %w", name, table, err)
		}
		s := ChainSummary{Rules: len(rules), Refs: use - len(rules)}
		for _, r := range rules {
			_, jumps := nfnl.RuleJumps(r.Attrs)
			s.Jumps = append(s.Jumps, jumps...)
		}
		out[name] = s
	}
	return out, nil
}

// unlink removes chain of the nat table of family f, and the rules of
// parent that jump to it, in one nf_tables transaction, without running
// iptables: iptables-nft's nat table is an nf_tables table, and deleting
// rules by handle needs no rule cache (iptables' -D by rule spec fetches
// every rule of parent and parses it). found is false when the chain does
// not exist.
//
// The socket c stays open for the life of the process: closing a
// netfilter socket after a deletion waits for the kernel to free what was
// deleted (an RCU grace period, ~15 ms here), which the process's exit
// pays anyway — later, overlapping its other work.
func unlink(c *nfnl.Conn, f plan.Family, parent, chain string) (found bool, err error) {
	if found, err := chainExists(c, f, chain); !found || err != nil {
		return false, err // no table or no chain: nothing to remove
	}
	fam := nfproto(f)
	var dump nfnl.Attrs
	dump.String(unix.NFTA_RULE_TABLE, Table).String(unix.NFTA_RULE_CHAIN, parent)
	rules, err := c.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETRULE), Family: fam, Attrs: dump.Bytes()})
	if err != nil {
		return true, fmt.Errorf("list rules of %s: %w", parent, err)
	}
	var msgs []nfnl.Msg
	for _, r := range rules {
		handle, jumps := nfnl.RuleJumps(r.Attrs)
		for _, j := range jumps {
			if j == chain && handle != 0 {
				var a nfnl.Attrs
				a.String(unix.NFTA_RULE_TABLE, Table).String(unix.NFTA_RULE_CHAIN, parent)
				a.Raw(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, handle))
				msgs = append(msgs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_DELRULE), Family: fam, Attrs: a.Bytes()})
				break
			}
		}
	}
	var flush, del nfnl.Attrs
	flush.String(unix.NFTA_RULE_TABLE, Table).String(unix.NFTA_RULE_CHAIN, chain)
	del.String(unix.NFTA_CHAIN_TABLE, Table).String(unix.NFTA_CHAIN_NAME, chain)
	msgs = append(msgs,
		nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_DELRULE), Family: fam, Attrs: flush.Bytes()},
		nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_DELCHAIN), Family: fam, Attrs: del.Bytes()})
	if err := c.Batch(msgs, true); err != nil {
		return true, fmt.Errorf("remove chain %s and %d rules of %s: %w", chain, len(msgs)-2, parent, err)
	}
	return true, nil
}
