package nft

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

// AsRead is the rule as DecodeRule reads it once written: what each of
// its statements does, its conditions (which only nft compiles) aside.
// A rule read back and one about to be written compare so (Lacks).
func (v *Rule) AsRead(f Family) *Rule {
	r := &Rule{Chain: v.Chain, Comment: v.Comment}
	for _, s := range v.Stmts {
		if _, ok := s.(Conditions); !ok {
			r.Stmts = append(r.Stmts, s)
		}
	}
	var a nfnl.Attrs
	r.Attrs(NewTx(f, "t"), &a)
	read := DecodeRule(f, nfnl.Parse(a.Bytes()))
	read.Chain = v.Chain
	return read
}

// Lacks says which statement of w (a rule as written, AsRead) the rule r
// read back does not hold, as nft spells it, or "". What r does besides
// is not judged (its conditions); an anonymous set of r's stands for
// any of w's.
func (r *Rule) Lacks(f Family, w *Rule) string {
	for _, s := range w.Stmts {
		if !slices.ContainsFunc(r.Stmts, func(g Stmt) bool { return sameStmt(g, s) }) {
			return s.Text(f)
		}
	}
	return ""
}

// sameStmt compares two statements read back; two lookups of one kind
// in anonymous sets are alike.
func sameStmt(a, b Stmt) bool {
	la, ok := a.(Lookup)
	lb, ok2 := b.(Lookup)
	if ok && ok2 && strings.HasPrefix(la.Set, "__") && strings.HasPrefix(lb.Set, "__") {
		la.Set, lb.Set = "", ""
		return la == lb
	}
	return a == b
}

// Lookups are the lookups r holds, in order.
func (r *Rule) Lookups() []Lookup {
	var out []Lookup
	for _, s := range r.Stmts {
		if l, ok := s.(Lookup); ok {
			out = append(out, l)
		}
	}
	return out
}

// StmtOf is the first statement of type T that r holds.
func StmtOf[T Stmt](r *Rule) (T, bool) {
	for _, s := range r.Stmts {
		if t, ok := s.(T); ok {
			return t, true
		}
	}
	var zero T
	return zero, false
}

// prefixSpec spells p as an Addr does: an address alone for a full
// length prefix.
func prefixSpec(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// DecodeRule reads a rule (a GETRULE answer, or what Rule.Attrs wrote)
// back into this package's statements, as the kernel runs its
// expressions: what a payload, meta or fib expression loads, a bitwise
// masks and a cmp, range, lookup or statement uses. What it matches
// otherwise (ct, an interface) reads as nothing; the keys a lookup
// reads and a set's elements are left to the expressions (nfttest runs
// them).
func DecodeRule(f Family, attrs []nfnl.Attr) *Rule {
	var list []byte
	d := ruleDecoder{f: f, r: &Rule{}}
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

// loaded is what the last load into a register read.
type loaded int

const (
	loadedOther loaded = iota
	loadedSaddr
	loadedDaddr
	loadedProto
	loadedDPort
	loadedMark
	loadedFib
)

// ruleDecoder reads a rule's expressions in order, as the kernel runs
// them: what the last load read (and its mask), what a cmp compares it
// with, what immediates put in the registers a nat reads.
type ruleDecoder struct {
	r    *Rule
	f    Family
	regs [16][]byte // by register number; nat reads the ones immediates loaded
	load struct {
		what      loaded
		len       uint32
		mask, xor []byte
	}
}

// ValueOf is the NFTA_DATA_VALUE of data attribute t of b (an
// expression's data, an element).
func ValueOf(data []byte, t uint16) []byte {
	x, _ := nfnl.Find(data, t)
	v, _ := nfnl.Find(x, unix.NFTA_DATA_VALUE)
	return v
}

// loads notes a load of what, len bytes long.
func (d *ruleDecoder) loads(what loaded, n uint32) {
	d.load.what, d.load.len, d.load.mask, d.load.xor = what, n, nil, nil
}

func (d *ruleDecoder) expr(name string, data []byte) {
	u := func(t uint16) uint32 { return nfnl.FindU32(data, t) }
	switch name {
	case "payload":
		base, off, n := u(unix.NFTA_PAYLOAD_BASE), u(unix.NFTA_PAYLOAD_OFFSET), u(unix.NFTA_PAYLOAD_LEN)
		saddr, _ := d.f.AddrOffset(false)
		daddr, _ := d.f.AddrOffset(true)
		switch {
		case base == unix.NFT_PAYLOAD_NETWORK_HEADER && off == saddr:
			d.loads(loadedSaddr, n)
		case base == unix.NFT_PAYLOAD_NETWORK_HEADER && off == daddr:
			d.loads(loadedDaddr, n)
		case base == unix.NFT_PAYLOAD_TRANSPORT_HEADER && off == 2 && n == 2:
			d.loads(loadedDPort, n)
		default:
			d.loads(loadedOther, n)
		}
	case "meta":
		key := u(unix.NFTA_META_KEY)
		if _, set := nfnl.Find(data, unix.NFTA_META_SREG); set {
			if key == unix.NFT_META_MARK && d.load.what == loadedMark && len(d.load.xor) == 4 {
				d.add(MarkOr{Mark: binary.NativeEndian.Uint32(d.load.xor)})
			}
			d.loads(loadedOther, 0)
			return
		}
		switch key {
		case unix.NFT_META_L4PROTO:
			d.loads(loadedProto, 1)
		case unix.NFT_META_MARK:
			d.loads(loadedMark, 4)
		default:
			d.loads(loadedOther, 0)
		}
	case "fib":
		if u(unix.NFTA_FIB_RESULT) == unix.NFT_FIB_RESULT_ADDRTYPE && u(unix.NFTA_FIB_FLAGS)&unix.NFTA_FIB_F_DADDR != 0 {
			d.loads(loadedFib, 4)
		} else {
			d.loads(loadedOther, 0)
		}
	case "bitwise":
		d.load.mask, d.load.xor = ValueOf(data, unix.NFTA_BITWISE_MASK), ValueOf(data, unix.NFTA_BITWISE_XOR)
	case "cmp":
		d.cmp(u(unix.NFTA_CMP_OP), ValueOf(data, unix.NFTA_CMP_DATA))
	case "range":
		if u(unix.NFTA_RANGE_OP) == unix.NFT_RANGE_EQ && d.load.what == loadedDPort {
			d.cmp(unix.NFT_CMP_GTE, ValueOf(data, unix.NFTA_RANGE_FROM_DATA))
			d.cmp(unix.NFT_CMP_LTE, ValueOf(data, unix.NFTA_RANGE_TO_DATA))
		}
	case "immediate":
		d.immediate(data)
	case "nat":
		ar, pr := u(unix.NFTA_NAT_REG_ADDR_MIN), u(unix.NFTA_NAT_REG_PROTO_MIN)
		if u(unix.NFTA_NAT_TYPE) == unix.NFT_NAT_DNAT && ar < uint32(len(d.regs)) && pr < uint32(len(d.regs)) && d.regs[ar] != nil {
			addr, _ := netip.AddrFromSlice(d.regs[ar])
			var port uint16
			if p := d.regs[pr]; pr != RegVerdict && len(p) >= 2 {
				port = binary.BigEndian.Uint16(p)
			}
			d.add(DNAT{To: netip.AddrPortFrom(addr, port)})
		}
	case "lookup":
		set, _ := nfnl.Find(data, unix.NFTA_LOOKUP_SET)
		l := Lookup{Set: nfnl.Attr{Value: set}.String(), Inv: u(unix.NFTA_LOOKUP_FLAGS)&unix.NFT_LOOKUP_F_INV != 0}
		if _, ok := nfnl.Find(data, unix.NFTA_LOOKUP_DREG); ok {
			l.Verdict, l.Data = u(unix.NFTA_LOOKUP_DREG) == RegVerdict, u(unix.NFTA_LOOKUP_DREG) != RegVerdict
		}
		d.add(l)
	case "masq":
		d.add(Masquerade{})
	default: // ct and others load what is not judged
		d.loads(loadedOther, 0)
	}
}

// cmp reads a comparison with what was loaded.
func (d *ruleDecoder) cmp(op uint32, v []byte) {
	switch l := d.load; {
	case (l.what == loadedSaddr || l.what == loadedDaddr) && op == unix.NFT_CMP_EQ:
		_, n := d.f.AddrOffset(false)
		ip := make([]byte, n)
		copy(ip, v)
		a, _ := netip.AddrFromSlice(ip)
		ones := int(l.len) * 8
		if l.mask != nil {
			ones = 0
			for _, byt := range l.mask {
				for ; byt != 0; byt <<= 1 {
					ones++
				}
			}
		}
		p, _ := a.Prefix(ones)
		d.add(Addr{Dst: l.what == loadedDaddr, Spec: prefixSpec(p)})
	case l.what == loadedProto && op == unix.NFT_CMP_EQ && len(v) == 1:
		d.add(L4Proto{Name: ProtoName(v[0])})
	case l.what == loadedDPort && len(v) == 2:
		port := int(binary.BigEndian.Uint16(v))
		last, span := DPort{}, false
		if n := len(d.r.Stmts); n > 0 {
			last, span = d.r.Stmts[n-1].(DPort)
		}
		switch {
		case op == unix.NFT_CMP_EQ || op == unix.NFT_CMP_GTE:
			d.add(DPort{Port: port})
		case op == unix.NFT_CMP_LTE && span:
			last.Last = port
			d.r.Stmts[len(d.r.Stmts)-1] = last
		}
	case l.what == loadedMark && op == unix.NFT_CMP_EQ && len(v) == 4 && bytes.Equal(l.mask, v):
		d.add(MarkHas{Mark: binary.NativeEndian.Uint32(v)})
	case l.what == loadedFib && op == unix.NFT_CMP_EQ && len(v) == 4 && binary.NativeEndian.Uint32(v) == unix.RTN_LOCAL:
		d.add(FibLocal{})
	}
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
		d.add(Jump{To: chain})
	case nfDrop:
		d.add(Drop{})
	}
}

func (d *ruleDecoder) add(s Stmt) { d.r.Stmts = append(d.r.Stmts, s) }

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
