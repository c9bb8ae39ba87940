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
// the hairpin sets, one per prefix length (the container's subnet;
// 127.0.0.1/32; masqAll's /0): hash sets, added to and deleted from at a
// constant cost (an interval set, pipapo, took ~12 ms to delete one
// element of 4000). The dispatch chain looks each length in use up before
// the DNAT; an ADD bringing a new length takes the slow path.
//
// The attachment's chain stays, naming its owner and, one claim rule
// each, its keys (what DEL removes without mappings, what CHECK
// compares); no rule jumps to it, so the walk at commit never reaches it.
// The owners map holds a goto to it, keyed by the name's two hashes: a
// release before flat attachments, rolled back to, fails to delete the
// chain (EBUSY) rather than leave its ports forwarded.
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
// Flat are the plans without conditions (which need a chain to run in)
// or identity ranges (ranges.go), marking with bit 13 (the dispatch
// chain's), of at most flatMax mappings (beyond, a dnatMap rule costs the
// kernel less than an element each in three sets).

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
