package xt

// The x_tables matches and targets of the rules native.go writes, and
// the address and port comparisons around them, as iptables-nft 1.8.7
// writes them.

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

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
			return nil, ErrNotNative
		}
		bits := 128
		if f == plan.IPv4 {
			bits = 32
		}
		v = ip.String() + "/" + strconv.Itoa(bits)
	}
	_, n, err := net.ParseCIDR(v)
	if err != nil || (n.IP.To4() != nil) != (f == plan.IPv4) {
		return nil, ErrNotNative
	}
	if f == plan.IPv4 {
		n.IP = n.IP.To4()
	}
	return n, nil
}

// addrMatch compares the source (or destination) address with n as
// iptables-nft does: the prefix's whole bytes alone when its mask ends
// on a byte, else the whole address through a mask.
func addrMatch(l nft.List, f plan.Family, dst bool, n *net.IPNet) {
	off, length := addrOffset(f, dst)
	whole := 0
	for whole < len(n.Mask) && n.Mask[whole] == 0xff {
		whole++
	}
	if isZero(n.Mask[whole:]) {
		l.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, off, uint32(whole), unix.NFT_REG_1)
		l.Cmp(unix.NFT_CMP_EQ, unix.NFT_REG_1, n.IP[:whole])
		return
	}
	l.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, off, length, unix.NFT_REG_1)
	l.Bitwise(unix.NFT_REG_1, n.Mask, make([]byte, len(n.Mask)))
	l.Cmp(unix.NFT_CMP_EQ, unix.NFT_REG_1, n.IP)
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

// MultiportInfo is struct xt_multiport_v1 for destination ports list
// ("80,8000:8010"): each port one slot, a range two, at most 15.
func MultiportInfo(list string) ([]byte, bool) {
	info := make([]byte, multiportLen)
	info[0] = multiportDest
	n := 0
	for _, spec := range strings.Split(list, ",") {
		first, last, ok := portSpan(spec, ":")
		if !ok || n+MultiportSlots(spec) > MaxMultiport {
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

// NatRange2 is struct nf_nat_range2 for DNAT's --to-destination as we
// write it: "addr", "addr:port", "addr:first-last/base" ("[v6]:…").
func NatRange2(f plan.Family, to string) ([]byte, bool) {
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

// MaxMultiport is the most ports one multiport match takes.
const MaxMultiport = 15

// MultiportSlots is what a port or a range "first:last" takes of a
// multiport match's 15.
func MultiportSlots(spec string) int {
	if strings.Contains(spec, ":") {
		return 2
	}
	return 1
}
