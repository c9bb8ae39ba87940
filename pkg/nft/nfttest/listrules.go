package nfttest

// Reading a rule back into nft text: its expressions in order, as nft
// reads the kernel's, each load naming what its register then holds and
// each compare, lookup or statement spelling what uses it.

import (
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// operand is what a register holds, as nft spells it: a header field, a
// meta or ct key, a fib result, the result of a bitwise operation on one
// of those, a value, or a map lookup's result.
type operand struct {
	text  string
	kind  operandKind
	size  uint32 // bytes loaded
	full  uint32 // an address's full length
	ones  int    // an address's prefix length after a mask; -1 without one
	and   bool   // masked (meta mark & 0x2000): compared with ==
	value []byte // an immediate's
}

type operandKind int

const (
	opOther operandKind = iota
	opAddr
	opPort
	opProto
	opMark
	opIfname
	opCtState
	opCtStatus
	opFib
	opValue
	opMap
)

// rules reads a rule's expressions back into nft text.
type rules struct {
	family uint8
	t      *table
	regs   map[uint32]operand
	out    []string
	lower  map[uint32][]byte // a >= compare waiting for its <=
}

// reg32 is a register's first 32-bit register: NFT_REG_1 to 4 are 8, 12,
// 16, 20.
func reg32(r uint32) uint32 {
	if r >= 1 && r <= 4 {
		return 8 + 4*(r-1)
	}
	return r
}

func ruleText(family uint8, attrs []byte, t *table) (string, error) {
	rd := &rules{family: family, t: t, regs: map[uint32]operand{}, lower: map[uint32][]byte{}}
	list, _ := nfnl.Find(attrs, unix.NFTA_RULE_EXPRESSIONS)
	for e := range nfnl.All(list) {
		name := str(e.Value, unix.NFTA_EXPR_NAME)
		data, _ := nfnl.Find(e.Value, unix.NFTA_EXPR_DATA)
		if err := rd.expr(name, data); err != nil {
			return "", err
		}
	}
	text := strings.Join(rd.out, " ")
	if c := ruleComment(attrs); c != "" {
		text += fmt.Sprintf(" comment %q", c)
	}
	return text, nil
}

func (rd *rules) fam() nft.Family {
	if rd.family == unix.NFPROTO_IPV6 {
		return nft.IPv6
	}
	return nft.IPv4
}

func (rd *rules) expr(name string, d []byte) error {
	u := func(typ uint16) uint32 { return nfnl.FindU32(d, typ) }
	switch name {
	case "payload":
		o, err := rd.payload(u(unix.NFTA_PAYLOAD_BASE), u(unix.NFTA_PAYLOAD_OFFSET), u(unix.NFTA_PAYLOAD_LEN))
		if err != nil {
			return err
		}
		rd.regs[reg32(u(unix.NFTA_PAYLOAD_DREG))] = o
	case "meta":
		key := u(unix.NFTA_META_KEY)
		if _, set := nfnl.Find(d, unix.NFTA_META_SREG); set {
			if key != unix.NFT_META_MARK {
				return fmt.Errorf("meta set of key %d", key)
			}
			rd.out = append(rd.out, "meta mark set "+rd.regs[reg32(u(unix.NFTA_META_SREG))].text)
			return nil
		}
		o, ok := map[uint32]operand{
			unix.NFT_META_L4PROTO: {text: "meta l4proto", kind: opProto, size: 1},
			unix.NFT_META_MARK:    {text: "meta mark", kind: opMark, size: 4},
			unix.NFT_META_IIFNAME: {text: "iifname", kind: opIfname, size: 16},
		}[key]
		if !ok {
			return fmt.Errorf("meta key %d", key)
		}
		rd.regs[reg32(u(unix.NFTA_META_DREG))] = o
	case "ct":
		o, ok := map[uint32]operand{
			unix.NFT_CT_STATE:  {text: "ct state", kind: opCtState, size: 4},
			unix.NFT_CT_STATUS: {text: "ct status", kind: opCtStatus, size: 4},
		}[u(unix.NFTA_CT_KEY)]
		if !ok {
			return fmt.Errorf("ct key %d", u(unix.NFTA_CT_KEY))
		}
		rd.regs[reg32(u(unix.NFTA_CT_DREG))] = o
	case "fib":
		if u(unix.NFTA_FIB_RESULT) != unix.NFT_FIB_RESULT_ADDRTYPE || u(unix.NFTA_FIB_FLAGS) != unix.NFTA_FIB_F_DADDR {
			return fmt.Errorf("fib result %d flags %#x", u(unix.NFTA_FIB_RESULT), u(unix.NFTA_FIB_FLAGS))
		}
		rd.regs[reg32(u(unix.NFTA_FIB_DREG))] = operand{text: "fib daddr type", kind: opFib, size: 4}
	case "bitwise":
		return rd.bitwise(reg32(u(unix.NFTA_BITWISE_SREG)), reg32(u(unix.NFTA_BITWISE_DREG)),
			nft.ValueOf(d, unix.NFTA_BITWISE_MASK), nft.ValueOf(d, unix.NFTA_BITWISE_XOR))
	case "cmp":
		return rd.cmp(reg32(u(unix.NFTA_CMP_SREG)), u(unix.NFTA_CMP_OP), nft.ValueOf(d, unix.NFTA_CMP_DATA))
	case "lookup":
		return rd.lookup(str(d, unix.NFTA_LOOKUP_SET), reg32(u(unix.NFTA_LOOKUP_SREG)), d)
	case "immediate":
		dreg := u(unix.NFTA_IMMEDIATE_DREG)
		imm, _ := nfnl.Find(d, unix.NFTA_IMMEDIATE_DATA)
		if dreg == unix.NFT_REG_VERDICT {
			v, _ := nfnl.Find(imm, unix.NFTA_DATA_VERDICT)
			rd.out = append(rd.out, verdictText(nfnl.Verdict(v)))
			return nil
		}
		rd.regs[reg32(dreg)] = operand{kind: opValue, value: nft.ValueOf(d, unix.NFTA_IMMEDIATE_DATA)}
	case "nat":
		return rd.nat(d)
	case "masq":
		rd.out = append(rd.out, "masquerade")
	case "counter":
		rd.out = append(rd.out, "counter")
	default:
		return fmt.Errorf("expression %q", name)
	}
	return nil
}

func (rd *rules) payload(base, offset, length uint32) (operand, error) {
	f := rd.fam()
	if base == unix.NFT_PAYLOAD_TRANSPORT_HEADER && offset == 2 && length == 2 {
		return operand{text: "th dport", kind: opPort, size: 2}, nil
	}
	for _, dst := range []bool{false, true} {
		off, full := f.AddrOffset(dst)
		if base == unix.NFT_PAYLOAD_NETWORK_HEADER && offset == off && length <= full {
			dir := map[bool]string{false: "saddr", true: "daddr"}[dst]
			return operand{text: f.String() + " " + dir, kind: opAddr, size: length, full: full, ones: -1}, nil
		}
	}
	return operand{}, fmt.Errorf("payload base %d offset %d length %d", base, offset, length)
}

func (rd *rules) bitwise(sreg, dreg uint32, mask, xor []byte) error {
	o := rd.regs[sreg]
	zero := func(b []byte) bool { return !slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) }
	switch o.kind {
	case opAddr:
		ones, bitsLen := net.IPMask(mask).Size()
		if !zero(xor) || bitsLen == 0 {
			return fmt.Errorf("bitwise on %s: mask %x xor %x", o.text, mask, xor)
		}
		o.ones = ones
	case opMark:
		m, x := binary.NativeEndian.Uint32(mask), binary.NativeEndian.Uint32(xor)
		switch {
		case x == 0:
			o.text, o.and = fmt.Sprintf("meta mark & %#x", m), true
		case m == ^x:
			o.text = fmt.Sprintf("meta mark | %#x", x)
		default:
			return fmt.Errorf("bitwise on meta mark: mask %#x xor %#x", m, x)
		}
	case opCtStatus:
		if !zero(xor) || binary.NativeEndian.Uint32(mask) != 0x20 { // IPS_DST_NAT
			return fmt.Errorf("bitwise on ct status: mask %x xor %x", mask, xor)
		}
		o.text, o.and = "ct status & dnat", true
	default:
		return fmt.Errorf("bitwise on %q", o.text)
	}
	rd.regs[dreg] = o
	return nil
}

// value spells v as o's type.
func (rd *rules) value(o operand, v []byte) (string, error) {
	switch o.kind {
	case opAddr:
		ip := make(net.IP, o.full)
		copy(ip, v)
		switch {
		case o.ones >= 0 && o.ones < int(8*o.full):
			return ip.String() + "/" + strconv.Itoa(o.ones), nil
		case o.size < o.full:
			return ip.String() + "/" + strconv.Itoa(int(8*o.size)), nil
		}
		return ip.String(), nil
	case opPort:
		return strconv.Itoa(int(binary.BigEndian.Uint16(v))), nil
	case opProto:
		if p := nft.ProtoName(v[0]); p != "" {
			return p, nil
		}
	case opMark, opCtStatus:
		return fmt.Sprintf("%#x", binary.NativeEndian.Uint32(v)), nil
	case opIfname:
		s, _, _ := strings.Cut(string(v), "\x00")
		return strconv.Quote(s), nil
	case opFib:
		if binary.NativeEndian.Uint32(v) == unix.RTN_LOCAL {
			return "local", nil
		}
	case opCtState:
		if s, ok := ctStateText(binary.NativeEndian.Uint32(v)); ok {
			return s, nil
		}
	}
	return "", fmt.Errorf("%s value %x", o.text, v)
}

// ctStateText is a ct state bit's name.
func ctStateText(v uint32) (string, bool) {
	name, ok := map[uint32]string{1: "invalid", 2: "established", 4: "related", 8: "new", 64: "untracked"}[v]
	if !ok {
		return fmt.Sprintf("%#x", v), false
	}
	return name, true
}

func (rd *rules) cmp(sreg, op uint32, v []byte) error {
	o := rd.regs[sreg]
	val, err := rd.value(o, v)
	if err != nil {
		return err
	}
	if o.kind == opCtStatus && val == "0x0" {
		val = "0"
	}
	switch {
	case op == unix.NFT_CMP_EQ && o.and:
		rd.out = append(rd.out, o.text+" == "+val)
	case op == unix.NFT_CMP_EQ:
		rd.out = append(rd.out, o.text+" "+val)
	case op == unix.NFT_CMP_NEQ:
		rd.out = append(rd.out, o.text+" != "+val)
	case op == unix.NFT_CMP_GTE:
		rd.lower[sreg] = v
	case op == unix.NFT_CMP_LTE && rd.lower[sreg] != nil:
		lo, _ := rd.value(o, rd.lower[sreg])
		delete(rd.lower, sreg)
		rd.out = append(rd.out, o.text+" "+lo+"-"+val)
	default:
		return fmt.Errorf("cmp op %d on %s", op, o.text)
	}
	return nil
}

// lookup reads the registers from sreg that make up the set's key (a
// concatenation: each field in registers of its own, rounded up to 4
// bytes) and spells the lookup: a match, a verdict map, or a data map
// whose result a later statement takes.
func (rd *rules) lookup(name string, sreg uint32, d []byte) error {
	i := slices.IndexFunc(rd.t.sets, func(s *set) bool { return s.name == name })
	if i < 0 {
		return fmt.Errorf("lookup in set %s, which does not exist", name)
	}
	s := rd.t.sets[i]
	var fields []string
	for left := nfnl.FindU32(s.attrs, unix.NFTA_SET_KEY_LEN); left > 0; {
		o, ok := rd.regs[sreg]
		if !ok || o.size == 0 {
			return fmt.Errorf("lookup in %s: register %d holds nothing", name, sreg)
		}
		t := o.text
		if o.kind == opAddr && o.ones >= 0 && o.ones < int(8*o.full) {
			t += " & " + net.IP(net.CIDRMask(o.ones, int(8*o.full))).String()
		}
		fields = append(fields, t)
		w := (o.size + 3) &^ 3
		left, sreg = left-min(left, w), sreg+w/4
	}
	ref := "@" + name
	if s.flags&unix.NFT_SET_ANONYMOUS != 0 {
		keyTypes, dataTypes, err := setTypes(s)
		if err != nil {
			return err
		}
		els := make([]string, len(s.elements))
		for i, e := range s.elements {
			els[i] = elementText(e, keyTypes, dataTypes)
		}
		ref = "{ " + strings.Join(els, ", ") + " }"
	}
	key := strings.Join(fields, " . ")
	dreg, hasData := nfnl.Find(d, unix.NFTA_LOOKUP_DREG)
	switch {
	case !hasData && nfnl.FindU32(d, unix.NFTA_LOOKUP_FLAGS)&unix.NFT_LOOKUP_F_INV != 0:
		rd.out = append(rd.out, key+" != "+ref)
	case !hasData:
		rd.out = append(rd.out, key+" "+ref)
	case nfnl.Attr{Value: dreg}.U32() == unix.NFT_REG_VERDICT:
		rd.out = append(rd.out, key+" vmap "+ref)
	default:
		rd.regs[reg32(nfnl.Attr{Value: dreg}.U32())] = operand{text: key + " map " + ref, kind: opMap}
	}
	return nil
}

// nat spells a DNAT: to an address and port held as values, or to what
// a map lookup gave.
func (rd *rules) nat(d []byte) error {
	if nfnl.FindU32(d, unix.NFTA_NAT_TYPE) != unix.NFT_NAT_DNAT {
		return fmt.Errorf("nat type %d", nfnl.FindU32(d, unix.NFTA_NAT_TYPE))
	}
	addr := rd.regs[reg32(nfnl.FindU32(d, unix.NFTA_NAT_REG_ADDR_MIN))]
	switch addr.kind {
	case opMap:
		rd.out = append(rd.out, "dnat "+rd.fam().String()+" to "+addr.text)
		return nil
	case opValue:
	default:
		return fmt.Errorf("dnat to %q", addr.text)
	}
	to := net.IP(addr.value).String()
	if _, ok := nfnl.Find(d, unix.NFTA_NAT_REG_PROTO_MIN); ok {
		port := rd.regs[reg32(nfnl.FindU32(d, unix.NFTA_NAT_REG_PROTO_MIN))]
		if port.kind != opValue || len(port.value) < 2 {
			return fmt.Errorf("dnat to port %q", port.text)
		}
		to = net.JoinHostPort(to, strconv.Itoa(int(binary.BigEndian.Uint16(port.value))))
	}
	rd.out = append(rd.out, "dnat to "+to)
	return nil
}
