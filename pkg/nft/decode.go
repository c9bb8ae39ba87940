package nft

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// RuleInfo is what a rule read back does, and the source prefix it
// matches, in the terms of this package's statements; rules nft compiled
// (conditions) read the same, their conditions aside. What else it
// matches is left to the expressions (nfttest runs them).
type RuleInfo struct {
	Handle  uint64
	Comment string
	Jump    string       // chain of a jump or goto verdict
	DNAT    DNAT         // the DNAT statement as written; an invalid To: none
	Saddr   netip.Prefix // source prefix matched, masked; invalid: none
	Lookup  string       // map of a verdict-map lookup
	// Member is the set a lookup without a result matches in.
	Member string
	// DNATMap is the map a DNAT looks its target up in.
	DNATMap string
	Masq    bool
	SetMark bool
	Drop    bool
}

// nfDrop is NF_DROP, a verdict code.
const nfDrop = 0

// DecodeRule reads what a rule matches and does out of its attributes
// (a GETRULE answer, or what Rule.Attrs wrote), as the kernel runs its
// expressions: what a payload or meta expression loads, a cmp compares.
func DecodeRule(f Family, attrs []nfnl.Attr) RuleInfo {
	var list []byte
	d := ruleDecoder{}
	d.saddrOffset, d.addrLen = f.AddrOffset(false)
	for _, a := range attrs {
		switch a.Type {
		case unix.NFTA_RULE_HANDLE:
			if len(a.Value) == 8 {
				d.r.Handle = binary.BigEndian.Uint64(a.Value)
			}
		case unix.NFTA_RULE_USERDATA:
			d.r.Comment = CommentOf(a.Value)
		case unix.NFTA_RULE_EXPRESSIONS:
			list = a.Value
		}
	}
	for le := range nfnl.All(list) {
		var name string
		var data []byte
		for x := range nfnl.All(le.Value) {
			switch x.Type {
			case unix.NFTA_EXPR_NAME:
				name = x.String()
			case unix.NFTA_EXPR_DATA:
				data = x.Value
			}
		}
		d.expr(name, data)
	}
	return d.r
}

// ruleDecoder reads a rule's expressions in order, as the kernel runs
// them: what a payload or meta expression loads, a cmp compares.
type ruleDecoder struct {
	r           RuleInfo
	regs        [16][]byte // by register number; nat reads the ones immediates loaded
	saddrOffset uint32
	addrLen     uint32
	load        struct {
		ok   bool // the source address is loaded
		len  uint32
		mask []byte
	}
}

// ValueOf is the NFTA_DATA_VALUE of data attribute t of b (an
// expression's data, an element).
func ValueOf(data []byte, t uint16) []byte {
	x, _ := nfnl.Find(data, t)
	v, _ := nfnl.Find(x, unix.NFTA_DATA_VALUE)
	return v
}

func (d *ruleDecoder) expr(name string, data []byte) {
	switch name {
	case "payload":
		base, off := nfnl.FindU32(data, unix.NFTA_PAYLOAD_BASE), nfnl.FindU32(data, unix.NFTA_PAYLOAD_OFFSET)
		d.load.ok = base == unix.NFT_PAYLOAD_NETWORK_HEADER && off == d.saddrOffset
		d.load.len, d.load.mask = nfnl.FindU32(data, unix.NFTA_PAYLOAD_LEN), nil
	case "bitwise":
		d.load.mask = ValueOf(data, unix.NFTA_BITWISE_MASK)
	case "cmp":
		d.cmp(data)
	case "immediate":
		d.immediate(data)
	case "nat":
		ar, pr := nfnl.FindU32(data, unix.NFTA_NAT_REG_ADDR_MIN), nfnl.FindU32(data, unix.NFTA_NAT_REG_PROTO_MIN)
		if nfnl.FindU32(data, unix.NFTA_NAT_TYPE) == unix.NFT_NAT_DNAT && ar < uint32(len(d.regs)) && pr < uint32(len(d.regs)) && d.regs[ar] != nil {
			addr, _ := netip.AddrFromSlice(d.regs[ar])
			var port uint16
			if p := d.regs[pr]; pr != RegVerdict && len(p) >= 2 {
				port = binary.BigEndian.Uint16(p)
			}
			d.r.DNAT = DNAT{To: netip.AddrPortFrom(addr, port)}
		}
	case "lookup":
		s, _ := nfnl.Find(data, unix.NFTA_LOOKUP_SET)
		if dreg, ok := nfnl.Find(data, unix.NFTA_LOOKUP_DREG); ok {
			if (nfnl.Attr{Value: dreg}).U32() == RegVerdict {
				d.r.Lookup = nfnl.Attr{Value: s}.String()
			} else {
				d.r.DNATMap = nfnl.Attr{Value: s}.String() // its elements are read apart
			}
		} else if nfnl.FindU32(data, unix.NFTA_LOOKUP_FLAGS)&unix.NFT_LOOKUP_F_INV == 0 {
			d.r.Member = nfnl.Attr{Value: s}.String()
		}
	case "masq":
		d.r.Masq = true
	case "meta":
		_, d.r.SetMark = nfnl.Find(data, unix.NFTA_META_SREG)
		d.load.ok = false
	}
}

// cmp reads a comparison with what was loaded: the source prefix.
func (d *ruleDecoder) cmp(data []byte) {
	v, op := ValueOf(data, unix.NFTA_CMP_DATA), nfnl.FindU32(data, unix.NFTA_CMP_OP)
	if d.load.ok && op == unix.NFT_CMP_EQ {
		ip := make([]byte, d.addrLen)
		copy(ip, v)
		a, _ := netip.AddrFromSlice(ip)
		ones := int(d.load.len) * 8
		if d.load.mask != nil {
			ones = 0
			for _, byt := range d.load.mask {
				for ; byt != 0; byt <<= 1 {
					ones++
				}
			}
		}
		d.r.Saddr, _ = a.Prefix(ones)
	}
	d.load.ok = false
}

// immediate reads a verdict (a jump, a drop) or a value loaded into a
// register for nat.
func (d *ruleDecoder) immediate(data []byte) {
	imm, _ := nfnl.Find(data, unix.NFTA_IMMEDIATE_DATA)
	if dreg := nfnl.FindU32(data, unix.NFTA_IMMEDIATE_DREG); dreg != RegVerdict {
		if v, ok := nfnl.Find(imm, unix.NFTA_DATA_VALUE); ok && dreg < uint32(len(d.regs)) {
			d.regs[dreg] = v
		}
		return
	}
	vd, _ := nfnl.Find(imm, unix.NFTA_DATA_VERDICT)
	switch code, chain := nfnl.Verdict(vd); code {
	case unix.NFT_JUMP, unix.NFT_GOTO:
		d.r.Jump = chain
	case nfDrop:
		d.r.Drop = true
	}
}

// ProtoName is the name of an IP protocol number (tcp, udp, sctp), ""
// for others.
func ProtoName(n byte) string {
	for _, p := range []string{"tcp", "udp", "sctp"} {
		if ProtoNum(p) == n {
			return p
		}
	}
	return ""
}

// DecodeElements reads the elements of a GETSETELEM answer (or of a
// NEWSETELEM request) into Elements of a Set that has only the name the
// list gives: the types a key is read by are the caller's.
func DecodeElements(b []byte) []Element {
	set := &Set{}
	var els []Element
	for a := range nfnl.All(b) {
		switch a.Type {
		case unix.NFTA_SET_ELEM_LIST_SET:
			set.Name = a.String()
		case unix.NFTA_SET_ELEM_LIST_ELEMENTS:
			for le := range nfnl.All(a.Value) {
				e := Element{Set: set, Key: ValueOf(le.Value, unix.NFTA_SET_ELEM_KEY), KeyEnd: ValueOf(le.Value, AttrSetElemKeyEnd)}
				data, _ := nfnl.Find(le.Value, unix.NFTA_SET_ELEM_DATA)
				if vd, ok := nfnl.Find(data, unix.NFTA_DATA_VERDICT); ok {
					_, e.Goto = nfnl.Verdict(vd)
				} else {
					e.Data, _ = nfnl.Find(data, unix.NFTA_DATA_VALUE)
				}
				if ud, ok := nfnl.Find(le.Value, AttrSetElemUserdata); ok {
					e.Comment = CommentOf(ud)
				}
				els = append(els, e)
			}
		}
	}
	return els
}
