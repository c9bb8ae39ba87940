package nftables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// netlinkKernel is the real kernel: nf_tables over netlink, in-process,
// one socket for the life of the backend. Only a transaction holding
// conditions (nft syntax) runs nft.
type netlinkKernel struct {
	mu   sync.Mutex
	conn *nfnl.Conn
}

func (k *netlinkKernel) c() (*nfnl.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.conn == nil {
		c, err := nfnl.Open()
		if err != nil {
			return nil, err
		}
		k.conn = c
	}
	return k.conn, nil
}

// Apply commits tx as one batch (or, for conditions, one nft -f).
func (k *netlinkKernel) Apply(tx *Tx) error { return k.batch(tx, true) }

// Validate sends tx without ending the batch: the kernel checks each
// message, then aborts.
func (k *netlinkKernel) Validate(tx *Tx) error { return k.batch(tx, false) }

func (k *netlinkKernel) batch(tx *Tx, commit bool) error {
	if tx.NeedsNft() {
		return runNft(tx.Text(), commit)
	}
	msgs, err := tx.Messages()
	if err != nil {
		return err
	}
	c, err := k.c()
	if err != nil {
		return err
	}
	if err := c.Batch(msgs, commit); err != nil {
		return &Error{Op: tx.describe(err), Err: err}
	}
	return nil
}

// nftPresent says why rules holding conditions cannot be written, or nil.
func nftPresent() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("conditionsV4/V6 are nft syntax, compiled by nft: %w", err)
	}
	return nil
}

// runNft feeds a script to nft: for rules holding conditions.
func runNft(script string, commit bool) error {
	if err := nftPresent(); err != nil {
		return err
	}
	path, _ := exec.LookPath("nft")
	args := []string{"-f", "-"}
	if !commit {
		args = []string{"--check", "-f", "-"}
	}
	cmd := exec.Command(path, args...)
	cmd.Stdin = strings.NewReader(script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return &Error{Op: "nft -f", Err: fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))}
	}
	return nil
}

// Error is a failed read or write of nf_tables: what it was, and why.
type Error struct {
	Op  string
	Err error
}

func (e *Error) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// IsNotFound reports whether err says that an object (a table, a chain, a
// map element) does not exist.
func IsNotFound(err error) bool { return errors.Is(err, unix.ENOENT) }

// describe names the operation a batch error is about.
func (tx *Tx) describe(err error) string {
	var ne *nfnl.Error
	if errors.As(err, &ne) {
		if ne.Index >= 0 && ne.Index < len(tx.msgOp) {
			i := tx.msgOp[ne.Index]
			one := &Tx{Family: tx.Family, Table: tx.Table, ops: tx.ops[i : i+1]}
			return strings.TrimSpace(one.Text())
		}
	}
	return fmt.Sprintf("%s transaction of %d operations", tx.Family, len(tx.ops))
}

func (k *netlinkKernel) Chain(f plan.Family, table, chain string) (*ChainState, error) {
	c, err := k.c()
	if err != nil {
		return nil, err
	}
	var get nfnl.Attrs
	get.String(unix.NFTA_CHAIN_TABLE, table).String(unix.NFTA_CHAIN_NAME, chain)
	reply, err := c.GetOne(nfnl.Msg{Type: msgType(unix.NFT_MSG_GETCHAIN), Family: uint8(nfproto(f)), Attrs: get.Bytes()})
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, &Error{Op: "get chain " + chain, Err: err}
	}
	ud, _ := nfnl.Find(reply.Attrs, nftaChainUserdata)
	cs := &ChainState{Comment: commentOf(ud)}
	var dump nfnl.Attrs
	dump.String(unix.NFTA_RULE_TABLE, table).String(unix.NFTA_RULE_CHAIN, chain)
	rules, err := c.Dump(nfnl.Msg{Type: msgType(unix.NFT_MSG_GETRULE), Family: uint8(nfproto(f)), Attrs: dump.Bytes()})
	if err != nil {
		return nil, &Error{Op: "list rules of chain " + chain, Err: err}
	}
	for _, r := range rules {
		cs.Rules = append(cs.Rules, decodeRule(f, r.Attrs))
	}
	return cs, nil
}

func (k *netlinkKernel) Holders(f plan.Family, keys []Key) (map[string]string, error) {
	out := map[string]string{}
	if len(keys) == 0 {
		return out, nil
	}
	c, err := k.c()
	if err != nil {
		return nil, err
	}
	reqs := make([]nfnl.Msg, len(keys))
	for i, key := range keys {
		var a nfnl.Attrs
		elementAttrs(&a, Table, key, "")
		reqs[i] = nfnl.Msg{Type: msgType(unix.NFT_MSG_GETSETELEM), Family: uint8(nfproto(f)), Attrs: a.Bytes()}
	}
	replies, errs, err := c.Get(reqs)
	if err != nil {
		return nil, err
	}
	for i, key := range keys {
		if IsNotFound(errs[i]) {
			continue
		}
		if errs[i] != nil {
			return nil, &Error{Op: "get element " + key.String() + " of map " + key.Map(), Err: errs[i]}
		}
		for _, e := range decodeElements(f, replies[i].Attrs) {
			out[key.ID()] = e.chain
		}
	}
	return out, nil
}

func (k *netlinkKernel) Table(f plan.Family, table string) (*State, error) {
	c, err := k.c()
	if err != nil {
		return nil, err
	}
	fam := uint8(nfproto(f))
	var get nfnl.Attrs
	get.String(unix.NFTA_TABLE_NAME, table)
	_, err = c.GetOne(nfnl.Msg{Type: msgType(unix.NFT_MSG_GETTABLE), Family: fam, Attrs: get.Bytes()})
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, &Error{Op: "get table " + table, Err: err}
	}
	s := &State{Chains: map[string]*ChainState{}, Maps: map[string]bool{}, Holders: map[string]string{}}
	chains, err := dumpOf(c, unix.NFT_MSG_GETCHAIN, fam, unix.NFTA_CHAIN_TABLE, table)
	if err != nil {
		return nil, &Error{Op: "list chains", Err: err}
	}
	for _, attrs := range chains {
		ud, _ := find(attrs, nftaChainUserdata)
		s.Chains[str(attrs, unix.NFTA_CHAIN_NAME)] = &ChainState{Comment: commentOf(ud)}
	}
	rules, err := dumpOf(c, unix.NFT_MSG_GETRULE, fam, unix.NFTA_RULE_TABLE, table)
	if err != nil {
		return nil, &Error{Op: "list rules", Err: err}
	}
	for _, attrs := range rules {
		if cs := s.Chains[str(attrs, unix.NFTA_RULE_CHAIN)]; cs != nil {
			cs.Rules = append(cs.Rules, decodeAttrs(f, attrs))
		}
	}
	sets, err := dumpOf(c, unix.NFT_MSG_GETSET, fam, unix.NFTA_SET_TABLE, table)
	if err != nil {
		return nil, &Error{Op: "list maps", Err: err}
	}
	for _, attrs := range sets {
		name := str(attrs, unix.NFTA_SET_NAME)
		s.Maps[name] = true
		if table != Table || (name != HostPortsMap && name != HostIPPortsMap) {
			continue
		}
		var el nfnl.Attrs
		el.String(unix.NFTA_SET_ELEM_LIST_TABLE, table).String(unix.NFTA_SET_ELEM_LIST_SET, name)
		elems, err := c.Dump(nfnl.Msg{Type: msgType(unix.NFT_MSG_GETSETELEM), Family: fam, Attrs: el.Bytes()})
		if err != nil {
			return nil, &Error{Op: "list map " + name, Err: err}
		}
		for _, em := range elems {
			for _, e := range decodeElements(f, em.Attrs) {
				s.Holders[e.key.ID()] = e.chain
			}
		}
	}
	return s, nil
}

// dumpOf dumps the family's objects of one kind (GETCHAIN, GETRULE,
// GETSET) and returns the attributes of those of table; tableAttr is the
// kind's table attribute, which also asks the kernel to filter where it
// can.
func dumpOf(c *nfnl.Conn, typ int, fam uint8, tableAttr uint16, table string) ([][]nfnl.Attr, error) {
	var req nfnl.Attrs
	req.String(tableAttr, table)
	msgs, err := c.Dump(nfnl.Msg{Type: msgType(typ), Family: fam, Attrs: req.Bytes()})
	if err != nil {
		return nil, err
	}
	var out [][]nfnl.Attr
	for _, m := range msgs {
		if attrs := nfnl.Parse(m.Attrs); str(attrs, tableAttr) == table {
			out = append(out, attrs)
		}
	}
	return out, nil
}

func find(attrs []nfnl.Attr, typ uint16) ([]byte, bool) {
	for _, a := range attrs {
		if a.Type == typ {
			return a.Value, true
		}
	}
	return nil, false
}

func str(attrs []nfnl.Attr, typ uint16) string {
	for _, a := range attrs {
		if a.Type == typ {
			return a.String()
		}
	}
	return ""
}

// commentOf reads the comment out of libnftnl user data.
func commentOf(b []byte) string {
	for len(b) >= 2 {
		t, l := b[0], int(b[1])
		if 2+l > len(b) {
			break
		}
		if t == udataComment {
			s, _, _ := strings.Cut(string(b[2:2+l]), "\x00")
			return s
		}
		b = b[2+l:]
	}
	return ""
}

type element struct {
	key   Key
	chain string
}

// decodeElements reads the elements of a GETSETELEM answer.
func decodeElements(f plan.Family, b []byte) []element {
	attrs := nfnl.Parse(b)
	set := str(attrs, unix.NFTA_SET_ELEM_LIST_SET)
	list, _ := nfnl.Find(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	var out []element
	for _, le := range nfnl.Parse(list) {
		var e element
		keyAttr, _ := nfnl.Find(le.Value, unix.NFTA_SET_ELEM_KEY)
		val, _ := nfnl.Find(keyAttr, unix.NFTA_DATA_VALUE)
		k, ok := keyFromBytes(f, set, val)
		if !ok {
			continue
		}
		e.key = k
		data, _ := nfnl.Find(le.Value, unix.NFTA_SET_ELEM_DATA)
		v, _ := nfnl.Find(data, unix.NFTA_DATA_VERDICT)
		ch, _ := nfnl.Find(v, unix.NFTA_VERDICT_CHAIN)
		e.chain, _, _ = strings.Cut(string(ch), "\x00")
		out = append(out, e)
	}
	return out
}

// keyFromBytes reads a key of map set back (Key.bytes).
func keyFromBytes(f plan.Family, set string, b []byte) (Key, bool) {
	var k Key
	if set == HostIPPortsMap {
		n := 4
		if f == plan.IPv6 {
			n = 16
		}
		if len(b) < n {
			return k, false
		}
		k.HostIP = append(net.IP(nil), b[:n]...)
		b = b[n:]
	} else if set != HostPortsMap {
		return k, false
	}
	if len(b) < 6 {
		return k, false
	}
	switch b[0] {
	case unix.IPPROTO_TCP:
		k.Protocol = plan.TCP
	case unix.IPPROTO_UDP:
		k.Protocol = plan.UDP
	case unix.IPPROTO_SCTP:
		k.Protocol = plan.SCTP
	default:
		return k, false
	}
	k.Port = int(binary.BigEndian.Uint16(b[4:6]))
	return k, true
}

// decodeRule reads what RuleState holds out of a rule message.
func decodeRule(f plan.Family, b []byte) RuleState { return decodeAttrs(f, nfnl.Parse(b)) }

// decodeAttrs is decodeRule of a rule's parsed attributes.
func decodeAttrs(f plan.Family, attrs []nfnl.Attr) RuleState {
	var r RuleState
	var list []byte
	for _, a := range attrs {
		switch a.Type {
		case unix.NFTA_RULE_HANDLE:
			if len(a.Value) == 8 {
				r.Handle = binary.BigEndian.Uint64(a.Value)
			}
		case nftaRuleUserdata:
			r.Comment = commentOf(a.Value)
		case unix.NFTA_RULE_EXPRESSIONS:
			list = a.Value
		}
	}
	var regs [16][]byte // by register number; nat reads the ones immediates loaded
	saddrOffset, addrLen := addrOffset(f, false)
	var load struct {
		ok   bool
		len  uint32
		mask []byte
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
		u32 := func(t uint16) uint32 {
			v, _ := nfnl.Find(data, t)
			return nfnl.Attr{Value: v}.U32()
		}
		value := func(t uint16) []byte {
			x, _ := nfnl.Find(data, t)
			v, _ := nfnl.Find(x, unix.NFTA_DATA_VALUE)
			return v
		}
		switch name {
		case "payload":
			load.ok = u32(unix.NFTA_PAYLOAD_BASE) == unix.NFT_PAYLOAD_NETWORK_HEADER && u32(unix.NFTA_PAYLOAD_OFFSET) == saddrOffset
			load.len, load.mask = u32(unix.NFTA_PAYLOAD_LEN), nil
		case "bitwise":
			load.mask = value(unix.NFTA_BITWISE_MASK)
		case "cmp":
			if load.ok && u32(unix.NFTA_CMP_OP) == unix.NFT_CMP_EQ {
				ip := make(net.IP, addrLen)
				copy(ip, value(unix.NFTA_CMP_DATA))
				ones := int(load.len) * 8
				if load.mask != nil {
					ones = 0
					for _, byt := range load.mask {
						for ; byt != 0; byt <<= 1 {
							ones++
						}
					}
				}
				r.Saddr = prefixString(ip, ones, int(addrLen)*8)
			}
			load.ok = false
		case "immediate":
			imm, _ := nfnl.Find(data, unix.NFTA_IMMEDIATE_DATA)
			if dreg := u32(unix.NFTA_IMMEDIATE_DREG); dreg != regVerdict {
				if v, ok := nfnl.Find(imm, unix.NFTA_DATA_VALUE); ok && dreg < uint32(len(regs)) {
					regs[dreg] = v
				}
				break
			}
			vd, _ := nfnl.Find(imm, unix.NFTA_DATA_VERDICT)
			switch code, chain := nfnl.Verdict(vd); code {
			case unix.NFT_JUMP, unix.NFT_GOTO:
				r.Jump = chain
			case nfDrop:
				r.Drop = true
			}
		case "nat":
			ar, pr := u32(unix.NFTA_NAT_REG_ADDR_MIN), u32(unix.NFTA_NAT_REG_PROTO_MIN)
			if u32(unix.NFTA_NAT_TYPE) == unix.NFT_NAT_DNAT && ar < uint32(len(regs)) && pr < uint32(len(regs)) {
				port := 0
				if p := regs[pr]; len(p) >= 2 {
					port = int(binary.BigEndian.Uint16(p))
				}
				r.DNAT = net.JoinHostPort(net.IP(regs[ar]).String(), strconv.Itoa(port))
			}
		case "lookup":
			if _, ok := nfnl.Find(data, unix.NFTA_LOOKUP_DREG); ok {
				s, _ := nfnl.Find(data, unix.NFTA_LOOKUP_SET)
				r.Lookup = nfnl.Attr{Value: s}.String()
			}
		case "masq":
			r.Masq = true
		case "meta":
			if _, ok := nfnl.Find(data, unix.NFTA_META_SREG); ok {
				r.SetMark = true
			}
		case "fib":
			r.Fib = true
		}
	}
	return r
}
