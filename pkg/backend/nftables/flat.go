package nftables

import (
	"encoding/binary"
	"net"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Flat attachments. On Linux 6.18 a transaction that adds any rule, or an
// element whose verdict jumps to a chain reached from a base chain, has
// the kernel walk the table's chains at commit (nft_table_validate): an
// attachment with a chain of rules reached through a verdict map made
// each ADD cost ~2 ms more beside 1000 attachments. A flat attachment
// adds no rule and no such verdict:
//
//	map hostport_dnat        { type inet_proto . inet_service : ipv4_addr . inet_service }
//	map hostip_hostport_dnat { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service }
//	set hairpin_24           { type ipv4_addr . inet_proto . inet_service }    one per source prefix length
//	set hostip_hairpin_24    { type ipv4_addr . ipv4_addr . inet_proto . inet_service }
//	chain dispatch { …
//	  ip saddr & 255.255.255.0 . ip daddr . meta l4proto . th dport @hostip_hairpin_24 meta mark set meta mark | 0x2000
//	  ip saddr . ip daddr . meta l4proto . th dport @hostip_hairpin_32 meta mark set meta mark | 0x2000
//	  dnat ip to ip daddr . meta l4proto . th dport map @hostip_hostport_dnat
//	  … }
//
// Each host port is an element of a DNAT map holding the container's
// address and port, commented with the attachment's chain (its owner) and
// the sources its connections are masqueraded from. Those are elements of
// the hairpin sets, one set per prefix length (the container's subnet;
// 127.0.0.1, a /32; masqAll's /0): the source masked to the length, and
// the key, looked up before the DNAT. Each is a hash set, whose elements
// are added and deleted at a constant cost: an interval set of sources
// (pipapo) took the kernel ~12 ms to delete one element of 4000. The
// dispatch chain holds a lookup for each length in use (a new length is
// written on the slow path, with the skeleton).
//
// The attachment's chain stays, naming its owner (its comment)
// and of its keys: one rule for each, which matches the key and does
// nothing else, commented "record tcp . 8080" — what DEL removes when the
// runtime gives no mappings, and what CHECK compares. No rule jumps to
// the chain, so the kernel's walk at commit never reaches it. An element
// of the shared verdict map owners, keyed by the chain name's two hashes
// (as an IPv6 address), holds a goto to the chain: a release before flat
// attachments, rolled back to, fails to delete the chain (EBUSY) rather
// than delete it and leave the ports forwarded.
//
//	map owners { type ipv6_addr : verdict }
//	chain dn-1b32c28cb38c0548-bb077adccaf7d21e { comment "net=… id=… if=…"
//	  meta l4proto tcp th dport 8080 comment "record tcp . 8080" }
//	owners: 1b32:c28c:b38c:548:bb07:7adc:caf7:d21e : goto dn-1b32c28cb38c0548-bb077adccaf7d21e
//
// The keys are rules, not elements of a map of the chain's own: the
// kernel finds a set by name by walking the table's sets, so beside 1000
// attachments a map each cost every ADD and DEL ~0.45 ms.
//
// Flat are the plans without conditions (which need a chain to run in),
// without identity ranges of ports (interval keys, ranges.go), marking
// with bit 13 (the dispatch chain's marks name it) and of at most flatMax
// mappings (beyond, one rule and an anonymous map in a chain cost the
// kernel less than an element each in three sets). The others keep a
// chain reached from the verdict maps.

// flatSetNames are the names of the DNAT maps and the hairpin sets of
// lengths.
func flatSetNames(lengths []int) []string {
	out := []string{ownersMap, hostIPDNATMap, HostDNATMap}
	for _, l := range lengths {
		out = append(out, hairpinSet(true, l), hairpinSet(false, l))
	}
	return out
}

// flatSets are the skeleton's owners map, DNAT maps and the hairpin sets
// of lengths.
func flatSets(f nft.Family, lengths []int) []*nft.Set {
	out := []*nft.Set{ownersSet(), dnatMapSet(f, hostIPDNATMap, true), dnatMapSet(f, HostDNATMap, false)}
	for _, addr := range []bool{true, false} {
		for _, l := range lengths {
			out = append(out, hairpinSetOf(f, addr, l))
		}
	}
	return out
}

// dnatMapSet declares a DNAT map: a key to an address and port.
func dnatMapSet(f nft.Family, name string, addr bool) *nft.Set {
	return &nft.Set{Name: name, Key: keyTypes(f, addr), Data: []nft.Type{f.AddrType(), nft.InetService}}
}

// flatDispatchRules are the dispatch chain's rules for flat keys of one
// host IP kind: the hairpin marks of each prefix length, then the DNAT.
func flatDispatchRules(addr bool, lengths []int) []*nft.Rule {
	dm := HostDNATMap
	if addr {
		dm = hostIPDNATMap
	}
	out := make([]*nft.Rule, 0, len(lengths)+1)
	for _, l := range lengths {
		out = append(out, &nft.Rule{Chain: DispatchChain, Stmts: []nft.Stmt{hairpinLookup{addr: addr, ones: l}, nft.MarkOr{Mark: 1 << flatMarkBit}}})
	}
	return append(out, &nft.Rule{Chain: DispatchChain, Stmts: []nft.Stmt{dnatLookup{set: dm, addr: addr}}})
}

// lengthsOf are the prefix lengths of ps' hairpin sources, and of the
// hairpin lookups chain c (the dispatch chain, as read) holds: the
// lengths the skeleton keeps, longest first.
func lengthsOf(c *ChainState, ps ...*plan.Plan) []int {
	seen := map[int]bool{}
	if c != nil {
		for _, r := range c.Rules {
			if _, l, ok := hairpinLength(r.Member); ok {
				seen[l] = true
			}
		}
	}
	for _, p := range ps {
		for _, src := range hairpinSrcs(p) {
			if isFlat(p) {
				ones, _ := nft.ParsePrefix(src).Mask.Size()
				seen[ones] = true
			}
		}
	}
	out := make([]int, 0, len(seen))
	for l := range seen {
		out = append(out, l)
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// flatDispatchRule reports whether r is one of the dispatch chain's rules
// for flat keys: required only of a flat plan's skeleton, so that the
// attachments of a node set up before them pass CHECK.
func flatDispatchRule(r *nft.Rule) bool {
	switch r.Stmts[0].(type) {
	case hairpinLookup, dnatLookup:
		return true
	}
	return false
}

// targetOf is where p sends key k of one port: "192.0.2.2:80".
func targetOf(p *plan.Plan, k Key) string {
	for m := range p.Mappings.All() {
		if m.Protocol == k.Protocol && m.HostPort == k.Port && m.HostIP.Equal(k.HostIP) {
			return p.Target(m)
		}
	}
	return ""
}

// dnatLookup: dnat ip to [ip daddr .] meta l4proto . th dport map
// @hostport_dnat — the DNAT of every flat key of a host IP kind.
type dnatLookup struct {
	set  string
	addr bool
}

func (s dnatLookup) Text(f nft.Family) string {
	t := "dnat " + f.String() + " to "
	if s.addr {
		t += f.String() + " daddr . "
	}
	return t + "meta l4proto . th dport map @" + s.set
}

func (s dnatLookup) Encode(e *nft.Exprs) { dnatByMap(e, s.addr, s.set, 0) }

// dnatByMap loads [the destination address,] the protocol and the port,
// looks them up in set (an anonymous one by its id) and DNATs to the
// address and port it holds.
func dnatByMap(e *nft.Exprs, addr bool, set string, id uint32) {
	next := uint32(nft.Reg32)
	protoReg := uint32(nft.Reg1)
	if addr {
		offset, length := e.Family.AddrOffset(true)
		e.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, offset, length, nft.Reg1)
		next += length / 4
		protoReg = next
	}
	e.Meta(unix.NFT_META_L4PROTO, protoReg)
	e.Payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, next+1)
	fam, ipLen := uint32(unix.NFPROTO_IPV4), uint32(4)
	if e.Family == nft.IPv6 {
		fam, ipLen = unix.NFPROTO_IPV6, 16
	}
	e.Add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, set)
		a.U32(unix.NFTA_LOOKUP_SREG, nft.Reg1)
		a.U32(unix.NFTA_LOOKUP_DREG, nft.Reg1)
		if id != 0 {
			a.U32(unix.NFTA_LOOKUP_SET_ID, id)
		}
	})
	e.Add("nat", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT)
		a.U32(unix.NFTA_NAT_FAMILY, fam)
		a.U32(unix.NFTA_NAT_REG_ADDR_MIN, nft.Reg1)
		// the port follows the address in the looked-up data; the kernel
		// takes the port as given when a register holds it, as nft writes
		a.U32(unix.NFTA_NAT_REG_PROTO_MIN, nft.Reg32+ipLen/4)
	})
}

// fastFlatTx is a flat ADD's fast path: create the attachment's chain
// with its claim rules and its owners element (failing if they exist) and its
// elements (failing if one exists: another attachment holds the key, or
// the maps are missing).
func fastFlatTx(p *plan.Plan, keys []Key) *nft.Tx {
	tx := newTx(p.Family)
	chain := ownChain(p)
	hps := wantedHairpins(p, keys)
	tx.Grow(2 + 2*len(keys) + len(hps))
	tx.Create(chain)
	for _, r := range claimRules(chain.Name, keys) {
		tx.Add(r)
	}
	tx.Create(ownerObj{chain.Name})
	srcs := hairpinSrcs(p)
	for _, k := range keys {
		tx.Create(elemObj{key: k, chain: chain.Name, to: targetOf(p, k), srcs: srcs})
	}
	for _, h := range hps {
		tx.Create(hairpinObj{h})
	}
	return tx
}

// flatGuards are the shared chains a flat plan's fast path needs and does
// not itself touch: the masquerade chain of the dispatch chain's mark, and
// the guard where localhost connections are DNATed.
func flatGuards(p *plan.Plan) []string {
	var out []string
	if p.Masquerade.Enabled {
		out = append(out, masqChain(flatMarkBit))
	}
	if p.LocalNet() {
		out = append(out, GuardChain)
	}
	return out
}

// toString spells a DNAT map's data as a target: "192.0.2.2:80".
func toString(ip, port []byte) string {
	return net.JoinHostPort(net.IP(ip).String(), strconv.Itoa(int(binary.BigEndian.Uint16(port))))
}
