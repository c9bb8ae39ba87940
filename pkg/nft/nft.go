// Package nft is a small nf_tables library: the objects a ruleset is made
// of (table, chain, set or map, rule with its statements), a transaction
// that adds, creates, flushes and deletes them all or nothing, spelled
// both as an nft script (as knftables writes it) and as the netlink
// batch the kernel takes, and the errors the kernel answers. It knows
// nothing of port mapping: pkg/backend/nftables lays portmap's rules out
// with it, and adds the kinds of element that layout keeps.
package nft

import "golang.org/x/sys/unix"

// Family is a table's family: IPv4 (nft's ip) or IPv6 (ip6). Its values
// are the IP versions, so a plan's family converts as it is.
type Family int

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// String is the family as nft spells it, which is also its address
// expression's keyword (ip daddr, ip6 saddr).
func (f Family) String() string {
	if f == IPv6 {
		return "ip6"
	}
	return "ip"
}

// Proto is the family's NFPROTO_* number, a netlink message's family.
func (f Family) Proto() uint8 {
	if f == IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// AddrType is the datatype of the family's addresses.
func (f Family) AddrType() Type {
	if f == IPv6 {
		return IPv6Addr
	}
	return IPv4Addr
}

// AddrOffset is where the source or destination address sits in the
// family's network header, and its length.
func (f Family) AddrOffset(dst bool) (offset, length uint32) {
	if f == IPv6 {
		if dst {
			return 24, 16
		}
		return 8, 16
	}
	if dst {
		return 16, 4
	}
	return 12, 4
}

// ProtoNum is the IP protocol number of a transport protocol's name
// (tcp, udp, sctp); TCP's for any other.
func ProtoNum(name string) byte {
	switch name {
	case "udp":
		return unix.IPPROTO_UDP
	case "sctp":
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
}
