package nfttest

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
)

// Packet is the first packet of a connection, as Trace follows it.
type Packet struct {
	Family   nft.Family // the zero value is IPv4
	Proto    string     // "tcp", "udp", "sctp"
	Src, Dst net.IP
	Dport    int
	// Output is true for a packet this host sends (the output hook),
	// false for one it receives (prerouting).
	Output bool
}

// Verdict is what the nat hooks did to a Packet.
type Verdict struct {
	// Chains are the chains it entered, base chains and those jumped or
	// gone to, in order.
	Chains []string
	// DNAT is where a dnat statement sent it ("192.0.2.2:80"; the port
	// it had when the statement names none); "" when none did.
	DNAT string
	// Masquerade is true when postrouting masquerades it.
	Masquerade bool
	// Dropped is true when a chain dropped it.
	Dropped bool
}

// Trace runs p through the nat base chains of its family's tables (and
// inet tables), as the kernel's hooks would: prerouting (output for a
// packet of this host), each base chain by priority, then postrouting
// with the mark it got. local says which addresses are this host's (fib
// daddr type). It evaluates the expressions rules hold — payload, meta,
// cmp, bitwise, immediate, lookup in sets and maps, fib, nat, masq,
// counter — and fails naming any other; conditions a transaction held
// were left out when it was applied (Apply), so they match.
func (k *Kernel) Trace(p Packet, local func(net.IP) bool) (Verdict, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	tr := &tracer{k: k, p: p, local: local}
	hook := uint32(unix.NF_INET_PRE_ROUTING)
	if p.Output {
		hook = unix.NF_INET_LOCAL_OUT
	}
	for _, h := range []uint32{hook, unix.NF_INET_POST_ROUTING} {
		if err := tr.hook(h); err != nil || tr.v.Dropped {
			return tr.v, err
		}
	}
	return tr.v, nil
}

type tracer struct {
	k     *Kernel
	p     Packet
	local func(net.IP) bool
	mark  uint32
	v     Verdict
	// the registers: four of 16 bytes (NFT_REG_1 to 4), which are also
	// sixteen of 4 (NFT_REG32_00 to 15); the verdict apart
	regs [64]byte
	code int32  // the verdict register
	to   string // a jump's or goto's chain
}

// hook runs the nat base chains of hook h by priority (then table and
// chain name), until one translates or drops the packet.
func (tr *tracer) hook(h uint32) error {
	type base struct {
		prio int32
		t    *table
		name string // table and chain
		c    *chain
	}
	var bases []base
	for key, t := range tr.k.tables {
		if key.family != tr.p.Family.Proto() && key.family != unix.NFPROTO_INET {
			continue
		}
		for _, c := range t.chains {
			hk, ok := nfnl.Find(c.attrs, unix.NFTA_CHAIN_HOOK)
			if !ok || str(c.attrs, unix.NFTA_CHAIN_TYPE) != "nat" || nfnl.FindU32(hk, unix.NFTA_HOOK_HOOKNUM) != h {
				continue
			}
			bases = append(bases, base{int32(nfnl.FindU32(hk, unix.NFTA_HOOK_PRIORITY)), t, key.name + " " + c.name, c})
		}
	}
	slices.SortFunc(bases, func(a, b base) int {
		if a.prio != b.prio {
			return cmp.Compare(a.prio, b.prio)
		}
		return cmp.Compare(a.name, b.name)
	})
	for _, b := range bases {
		code, err := tr.chain(b.t, b.c, 0)
		if err != nil {
			return err
		}
		switch {
		case code == nfDrop:
			tr.v.Dropped = true
			return nil
		case tr.v.DNAT != "" && h != unix.NF_INET_POST_ROUTING, tr.v.Masquerade:
			return nil // the connection is bound: later nat chains are not asked
		}
	}
	return nil
}

// chain runs c's rules as nft_do_chain does and returns the verdict that
// ends it: NF_ACCEPT, NF_DROP, or NFT_RETURN.
func (tr *tracer) chain(t *table, c *chain, depth int) (int32, error) {
	if depth > 16 {
		return 0, fmt.Errorf("chain %s: jumps nested deeper than 16", c.name)
	}
	tr.v.Chains = append(tr.v.Chains, c.name)
	for _, r := range c.rules {
		if err := tr.rule(t, r); err != nil {
			return 0, fmt.Errorf("chain %s, rule %d: %w", c.name, r.handle, err)
		}
		switch code := tr.code; code {
		case unix.NFT_CONTINUE, unix.NFT_BREAK:
			continue
		case unix.NFT_JUMP, unix.NFT_GOTO:
			_, next := t.chain(tr.to)
			if next == nil {
				return 0, fmt.Errorf("chain %s: no chain %s to go to", c.name, tr.to)
			}
			got, err := tr.chain(t, next, depth+1)
			if err != nil || code == unix.NFT_GOTO || got != unix.NFT_RETURN {
				return got, err
			}
		default: // NF_ACCEPT, NF_DROP, NFT_RETURN
			return code, nil
		}
	}
	return unix.NFT_RETURN, nil
}

// rule runs r's expressions until one sets a verdict.
func (tr *tracer) rule(t *table, r *rule) error {
	tr.code = unix.NFT_CONTINUE
	list, _ := nfnl.Find(r.attrs, unix.NFTA_RULE_EXPRESSIONS)
	for e := range nfnl.All(list) {
		name := str(e.Value, unix.NFTA_EXPR_NAME)
		data, _ := nfnl.Find(e.Value, unix.NFTA_EXPR_DATA)
		if err := tr.expr(t, name, data); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if tr.code != unix.NFT_CONTINUE {
			return nil
		}
	}
	return nil
}

// reg is n bytes of register r (its first at NFT_REG_1 or
// NFT_REG32_00's place).
func (tr *tracer) reg(r uint32, n int) ([]byte, error) {
	off := -1
	switch {
	case r >= unix.NFT_REG_1 && r <= unix.NFT_REG_4:
		off = int(r-unix.NFT_REG_1) * 16
	case r >= unix.NFT_REG32_00 && r <= unix.NFT_REG32_15:
		off = int(r-unix.NFT_REG32_00) * 4
	}
	if off < 0 || n < 0 || off+n > len(tr.regs) {
		return nil, fmt.Errorf("register %d of %d bytes", r, n)
	}
	return tr.regs[off : off+n], nil
}

// load puts v in register r, zero-padded to whole 4-byte words as the
// kernel's stores are.
func (tr *tracer) load(r uint32, v []byte) error {
	dst, err := tr.reg(r, (len(v)+3)&^3)
	if err != nil {
		return err
	}
	clear(dst)
	copy(dst, v)
	return nil
}

// header is the packet's network header (20 or 40 bytes) and its
// transport header's ports.
func (tr *tracer) header(base uint32) []byte {
	p := tr.p
	if base == unix.NFT_PAYLOAD_TRANSPORT_HEADER {
		return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, 40000), uint16(p.Dport))
	}
	if p.Family == nft.IPv6 {
		h := make([]byte, 40)
		h[0], h[6] = 0x60, nft.ProtoNum(p.Proto)
		copy(h[8:], p.Src.To16())
		copy(h[24:], p.Dst.To16())
		return h
	}
	h := make([]byte, 20)
	h[0], h[9] = 0x45, nft.ProtoNum(p.Proto)
	copy(h[12:], p.Src.To4())
	copy(h[16:], p.Dst.To4())
	return h
}

// expr evaluates one expression.
func (tr *tracer) expr(t *table, name string, d []byte) error {
	switch name {
	case "counter":
	case "payload":
		h := tr.header(nfnl.FindU32(d, unix.NFTA_PAYLOAD_BASE))
		off, n := int(nfnl.FindU32(d, unix.NFTA_PAYLOAD_OFFSET)), int(nfnl.FindU32(d, unix.NFTA_PAYLOAD_LEN))
		if off+n > len(h) {
			return fmt.Errorf("%d bytes at %d, beyond the header", n, off)
		}
		return tr.load(nfnl.FindU32(d, unix.NFTA_PAYLOAD_DREG), h[off:off+n])
	case "meta":
		return tr.meta(nfnl.FindU32(d, unix.NFTA_META_KEY), d)
	case "cmp":
		want := nft.ValueOf(d, unix.NFTA_CMP_DATA)
		got, err := tr.reg(nfnl.FindU32(d, unix.NFTA_CMP_SREG), len(want))
		if err != nil {
			return err
		}
		c := bytes.Compare(got, want)
		var ok bool
		switch nfnl.FindU32(d, unix.NFTA_CMP_OP) {
		case unix.NFT_CMP_EQ:
			ok = c == 0
		case unix.NFT_CMP_NEQ:
			ok = c != 0
		case unix.NFT_CMP_LT:
			ok = c < 0
		case unix.NFT_CMP_LTE:
			ok = c <= 0
		case unix.NFT_CMP_GT:
			ok = c > 0
		case unix.NFT_CMP_GTE:
			ok = c >= 0
		}
		if !ok {
			tr.code = unix.NFT_BREAK
		}
	case "bitwise":
		mask, xor := nft.ValueOf(d, unix.NFTA_BITWISE_MASK), nft.ValueOf(d, unix.NFTA_BITWISE_XOR)
		src, err := tr.reg(nfnl.FindU32(d, unix.NFTA_BITWISE_SREG), int(nfnl.FindU32(d, unix.NFTA_BITWISE_LEN)))
		if err != nil || len(mask) != len(src) || len(xor) != len(src) {
			return fmt.Errorf("a mask and xor of %d bytes: %v", len(src), err)
		}
		out := make([]byte, len(src))
		for i := range out {
			out[i] = src[i]&mask[i] ^ xor[i]
		}
		return tr.load(nfnl.FindU32(d, unix.NFTA_BITWISE_DREG), out)
	case "immediate":
		data, _ := nfnl.Find(d, unix.NFTA_IMMEDIATE_DATA)
		if vd, ok := nfnl.Find(data, unix.NFTA_DATA_VERDICT); ok {
			tr.code, tr.to = nfnl.Verdict(vd)
			return nil
		}
		return tr.load(nfnl.FindU32(d, unix.NFTA_IMMEDIATE_DREG), nft.ValueOf(d, unix.NFTA_IMMEDIATE_DATA))
	case "lookup":
		return tr.lookup(t, d)
	case "fib":
		if nfnl.FindU32(d, unix.NFTA_FIB_RESULT) != unix.NFT_FIB_RESULT_ADDRTYPE || nfnl.FindU32(d, unix.NFTA_FIB_FLAGS) != unix.NFTA_FIB_F_DADDR {
			return fmt.Errorf("result %d, flags %#x: only daddr type", nfnl.FindU32(d, unix.NFTA_FIB_RESULT), nfnl.FindU32(d, unix.NFTA_FIB_FLAGS))
		}
		typ := uint32(unix.RTN_UNICAST)
		if tr.local(tr.p.Dst) {
			typ = unix.RTN_LOCAL
		}
		return tr.load(nfnl.FindU32(d, unix.NFTA_FIB_DREG), binary.NativeEndian.AppendUint32(nil, typ))
	case "nat":
		return tr.nat(d)
	case "masq":
		tr.v.Masquerade, tr.code = true, nfAccept
	default:
		return fmt.Errorf("an expression the tracer does not know")
	}
	return nil
}

// meta loads key (l4proto, nfproto, mark) or, with a source register,
// sets the mark.
func (tr *tracer) meta(key uint32, d []byte) error {
	if _, set := nfnl.Find(d, unix.NFTA_META_SREG); set {
		v, err := tr.reg(nfnl.FindU32(d, unix.NFTA_META_SREG), 4)
		if err != nil || key != unix.NFT_META_MARK {
			return fmt.Errorf("set of key %d: %v", key, err)
		}
		tr.mark = binary.NativeEndian.Uint32(v)
		return nil
	}
	var v []byte
	switch key {
	case unix.NFT_META_L4PROTO:
		v = []byte{nft.ProtoNum(tr.p.Proto)}
	case unix.NFT_META_NFPROTO:
		v = []byte{tr.p.Family.Proto()}
	case unix.NFT_META_MARK:
		v = binary.NativeEndian.AppendUint32(nil, tr.mark)
	default:
		return fmt.Errorf("key %d", key)
	}
	return tr.load(nfnl.FindU32(d, unix.NFTA_META_DREG), v)
}

// lookup looks the source register up in a set, or a map that loads the
// destination register or the verdict; a miss (a hit, inverted) ends the
// rule.
func (tr *tracer) lookup(t *table, d []byte) error {
	name := str(d, unix.NFTA_LOOKUP_SET)
	_, s := t.set(name)
	if s == nil {
		return fmt.Errorf("no set %s", name)
	}
	key, err := tr.reg(nfnl.FindU32(d, unix.NFTA_LOOKUP_SREG), int(nfnl.FindU32(s.attrs, unix.NFTA_SET_KEY_LEN)))
	if err != nil {
		return err
	}
	e := s.holding(key)
	if (e == nil) != (nfnl.FindU32(d, unix.NFTA_LOOKUP_FLAGS)&unix.NFT_LOOKUP_F_INV != 0) {
		tr.code = unix.NFT_BREAK
		return nil
	}
	if _, mapped := nfnl.Find(d, unix.NFTA_LOOKUP_DREG); !mapped || e == nil {
		return nil
	}
	if vd, ok := nfnl.Find(e.data, unix.NFTA_DATA_VERDICT); ok {
		tr.code, tr.to = nfnl.Verdict(vd)
		return nil
	}
	v, _ := nfnl.Find(e.data, unix.NFTA_DATA_VALUE)
	return tr.load(nfnl.FindU32(d, unix.NFTA_LOOKUP_DREG), v)
}

// nat translates the destination to the address (and port) its
// registers hold; a source translation fails.
func (tr *tracer) nat(d []byte) error {
	if nfnl.FindU32(d, unix.NFTA_NAT_TYPE) != unix.NFT_NAT_DNAT {
		return fmt.Errorf("type %d: only dnat", nfnl.FindU32(d, unix.NFTA_NAT_TYPE))
	}
	n := 4
	if nfnl.FindU32(d, unix.NFTA_NAT_FAMILY) == unix.NFPROTO_IPV6 {
		n = 16
	}
	a, err := tr.reg(nfnl.FindU32(d, unix.NFTA_NAT_REG_ADDR_MIN), n)
	if err != nil {
		return err
	}
	addr, _ := netip.AddrFromSlice(a)
	port := tr.p.Dport
	if _, ok := nfnl.Find(d, unix.NFTA_NAT_REG_PROTO_MIN); ok {
		v, err := tr.reg(nfnl.FindU32(d, unix.NFTA_NAT_REG_PROTO_MIN), 2)
		if err != nil {
			return err
		}
		port = int(binary.BigEndian.Uint16(v))
	}
	tr.v.DNAT, tr.code = net.JoinHostPort(addr.String(), strconv.Itoa(port)), nfAccept
	return nil
}

// netfilter's verdicts (linux/netfilter.h)
const (
	nfDrop   = 0
	nfAccept = 1
)
