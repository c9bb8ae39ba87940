package nftables

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
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
	nft.Lookup{Set: set, ID: id, Data: true}.Encode(e)
	e.Add("nat", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT)
		a.U32(unix.NFTA_NAT_FAMILY, fam)
		a.U32(unix.NFTA_NAT_REG_ADDR_MIN, nft.Reg1)
		// the port follows the address in the looked-up data; the kernel
		// takes the port as given when a register holds it, as nft writes
		a.U32(unix.NFTA_NAT_REG_PROTO_MIN, nft.Reg32+ipLen/4)
	})
}

// targetOf reads a DNAT map's data as a target: the address, and the
// port after it.
func targetOf(ip, port []byte) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(port))
}
