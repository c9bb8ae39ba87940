package xt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// LegacyTable reports whether iptables-legacy's table of family f exists
// in this thread's network namespace: x_tables lists the tables it holds
// in ip_tables_names (ip6_tables_names). Without one, whatever iptables
// made here lives in nf_tables (iptables-nft: tables "ip nat", "ip6
// nat"), or does not exist. It asks the kernel, not the tool's name: a
// tool called iptables-restore may be either.
func LegacyTable(f plan.Family, table string) bool {
	name := "/proc/thread-self/net/ip_tables_names"
	if f == plan.IPv6 {
		name = "/proc/thread-self/net/ip6_tables_names"
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return false // x_tables not loaded: no legacy table anywhere
	}
	return slices.Contains(strings.Fields(string(b)), table)
}

// Summarize reads chains of table of family f: a get of each chain (the
// kernel answers ENOENT for a missing chain or table; its use count is
// the chain's rules and the rules that jump to it) and, withRules, a
// dump of its rules alone (the kernel looks the chain up by name: other
// chains are not read).
func Summarize(c *nfnl.Conn, f plan.Family, table string, names []string, withRules bool) (map[string]ChainSummary, error) {
	out := map[string]ChainSummary{}
	// the chains' gets in one exchange (a pass asks for every attachment's)
	gets := make([]nfnl.Msg, len(names))
	for i, name := range names {
		var get nfnl.Attrs
		get.String(unix.NFTA_CHAIN_TABLE, table).String(unix.NFTA_CHAIN_NAME, name)
		gets[i] = nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETCHAIN), Family: nft.Family(f).Proto(), Attrs: get.Bytes()}
	}
	replies, errs, err := c.Get(gets)
	if err != nil {
		return nil, fmt.Errorf("get chains of table %s: %w", table, err)
	}
	for i, name := range names {
		reply, err := replies[i], errs[i]
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get chain %s of table %s: %w", name, table, err)
		}
		// The chain's use count: its own rules and the rules that jump to it.
		use := int(nfnl.FindU32(reply.Attrs, unix.NFTA_CHAIN_USE))
		if !withRules {
			out[name] = ChainSummary{}
			continue
		}
		rules, err := dumpRules(c, nft.Family(f).Proto(), table, name)
		if err != nil {
			return nil, err
		}
		s := ChainSummary{Rules: len(rules), Refs: use - len(rules)}
		for _, r := range rules {
			_, jumps := nfnl.RuleJumps(r.Attrs)
			s.Jumps = append(s.Jumps, jumps...)
			e, _ := nfnl.Find(r.Attrs, unix.NFTA_RULE_EXPRESSIONS)
			s.Exprs = append(s.Exprs, e)
		}
		out[name] = s
	}
	return out, nil
}

// UnlinkOn removes chain of the nat table of family f, and the rules of
// parent that jump to it, in one nf_tables transaction, without running
// iptables: iptables-nft's nat table is an nf_tables table, and deleting
// rules by handle needs no rule cache (iptables' -D by rule spec fetches
// every rule of parent and parses it). found is false when the chain does
// not exist.
//
// The jumps are found without reading parent, whose rules grow with the
// attachments: the kernel numbers a table's chains and rules from one
// counter as it takes them, and ADD writes the chain's rules, then its
// jumps, in one transaction, so the jumps are the rules that follow the
// chain's last one. The chain's use count says how many there are
// (references = use − its own rules). Those handles are asked of parent
// one by one; each answer is taken only if it jumps to chain, and only
// when all of them are found so. Otherwise (rules written by another
// tool, or in other orders) parent is dumped, as it always was.
//
// The socket c stays open for the life of the process: closing a
// netfilter socket after a deletion waits for the kernel to free what was
// deleted (an RCU grace period, ~15 ms here), which the process's exit
// pays anyway — later, overlapping its other work.
//
// read is how many of parent's rules were read.
func UnlinkOn(c *nfnl.Conn, f plan.Family, parent, chain string) (found bool, read int, err error) {
	fam := nft.Family(f).Proto()
	var get nfnl.Attrs
	get.String(unix.NFTA_CHAIN_TABLE, NAT).String(unix.NFTA_CHAIN_NAME, chain)
	reply, err := c.GetOne(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETCHAIN), Family: fam, Attrs: get.Bytes()})
	if errors.Is(err, unix.ENOENT) {
		return false, 0, nil // no table or no chain: nothing to remove
	}
	if err != nil {
		return false, 0, fmt.Errorf("get chain %s: %w", chain, err)
	}
	use, last := nfnl.FindU32(reply.Attrs, unix.NFTA_CHAIN_USE), nfnl.FindU64(reply.Attrs, unix.NFTA_CHAIN_HANDLE)
	own, err := dumpRules(c, fam, NAT, chain)
	if err != nil {
		return true, 0, err
	}
	for _, r := range own {
		last = max(last, nfnl.FindU64(r.Attrs, unix.NFTA_RULE_HANDLE))
	}
	refs := int(use) - len(own)
	var jumps []uint64
	if refs > 0 {
		jumps, read, err = jumpsAfter(c, fam, parent, chain, last, refs)
		if err != nil {
			return true, read, err
		}
		if len(jumps) != refs {
			var more int
			jumps, more, err = jumpsIn(c, fam, parent, chain)
			read += more
			if err != nil {
				return true, read, err
			}
		}
	}
	var msgs []nfnl.Msg
	for _, h := range jumps {
		var a nfnl.Attrs
		a.String(unix.NFTA_RULE_TABLE, NAT).String(unix.NFTA_RULE_CHAIN, parent)
		a.Raw(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, h))
		msgs = append(msgs, nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_DELRULE), Family: fam, Attrs: a.Bytes()})
	}
	var flush, del nfnl.Attrs
	flush.String(unix.NFTA_RULE_TABLE, NAT).String(unix.NFTA_RULE_CHAIN, chain)
	del.String(unix.NFTA_CHAIN_TABLE, NAT).String(unix.NFTA_CHAIN_NAME, chain)
	msgs = append(msgs,
		nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_DELRULE), Family: fam, Attrs: flush.Bytes()},
		nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_DELCHAIN), Family: fam, Attrs: del.Bytes()})
	if err := c.Batch(msgs, true); err != nil {
		return true, read, fmt.Errorf("remove chain %s and %d rules of %s: %w", chain, len(msgs)-2, parent, err)
	}
	return true, read, nil
}

// jumpSlack is how many handles past the expected ones jumpsAfter asks
// about: room for a rule of another chain written in the same
// transaction between the chain's rules and its jumps.
const jumpSlack = 4

// jumpsAfter asks parent for the rules with handles after last (up to
// refs+jumpSlack of them, in one round trip) and returns the handles of
// those that jump to chain, and how many rules it read.
func jumpsAfter(c *nfnl.Conn, fam uint8, parent, chain string, last uint64, refs int) (jumps []uint64, read int, err error) {
	reqs := make([]nfnl.Msg, refs+jumpSlack)
	for i := range reqs {
		var a nfnl.Attrs
		a.String(unix.NFTA_RULE_TABLE, NAT).String(unix.NFTA_RULE_CHAIN, parent)
		a.Raw(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, last+1+uint64(i)))
		reqs[i] = nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETRULE), Family: fam, Attrs: a.Bytes()}
	}
	replies, errs, err := c.Get(reqs)
	if err != nil {
		return nil, 0, fmt.Errorf("get rules of %s: %w", parent, err)
	}
	for i, r := range replies {
		if errs[i] != nil {
			if errors.Is(errs[i], unix.ENOENT) {
				continue // not a rule of parent (another chain's, or gone)
			}
			return nil, read, fmt.Errorf("get rule %d of %s: %w", last+1+uint64(i), parent, errs[i])
		}
		read++
		if handle, to := nfnl.RuleJumps(r.Attrs); handle != 0 && slices.Contains(to, chain) {
			jumps = append(jumps, handle)
		}
	}
	return jumps, read, nil
}

// jumpsIn dumps parent and returns the handles of its rules that jump to
// chain, and how many rules it read.
func jumpsIn(c *nfnl.Conn, fam uint8, parent, chain string) (jumps []uint64, read int, err error) {
	rules, err := dumpRules(c, fam, NAT, parent)
	if err != nil {
		return nil, 0, err
	}
	for _, r := range rules {
		if handle, to := nfnl.RuleJumps(r.Attrs); handle != 0 && slices.Contains(to, chain) {
			jumps = append(jumps, handle)
		}
	}
	return jumps, len(rules), nil
}

// Unlink is the DEL's removal over netlink on its own socket: chain of
// the nat table of family f and parent's rules that jump to it, with how
// many of parent's rules it read (what the kernel tests judge).
func Unlink(f plan.Family, parent, chain string) (found bool, read int, err error) {
	if LegacyTable(f, NAT) {
		return false, 0, ErrLegacy
	}
	c, err := nfnl.Open()
	if err != nil {
		return false, 0, err
	}
	defer c.Close()
	return UnlinkOn(c, f, parent, chain)
}

// dumpRules reads the rules of one chain of table (the kernel looks the
// chain up by name: other chains are not read).
func dumpRules(c *nfnl.Conn, fam uint8, table, chain string) ([]nfnl.Reply, error) {
	var dump nfnl.Attrs
	dump.String(unix.NFTA_RULE_TABLE, table).String(unix.NFTA_RULE_CHAIN, chain)
	rules, err := c.Dump(nfnl.Msg{Type: nfnl.NftType(unix.NFT_MSG_GETRULE), Family: fam, Attrs: dump.Bytes()})
	if err != nil {
		return nil, fmt.Errorf("list rules of %s of table %s: %w", chain, table, err)
	}
	return rules, nil
}

// exprForm is an expression as CHECK compares it: its name and its
// attributes by path ("3", "2.2.1"). The kernel dumps a rule in its own
// order of attributes and without the nested flag, and the counter's
// values are the traffic's: so neither order nor flags count, and a
// counter is its name.
type exprForm struct {
	name  string
	attrs map[string]string
}

// nestedAttrs are the paths of the attributes that hold attributes, by
// expression (the dump does not flag them).
var nestedAttrs = map[string]map[string]bool{
	"cmp":       {"3": true},              // NFTA_CMP_DATA
	"range":     {"3": true, "4": true},   // NFTA_RANGE_FROM_DATA, _TO_DATA
	"bitwise":   {"4": true, "5": true},   // NFTA_BITWISE_MASK, _XOR
	"immediate": {"2": true, "2.2": true}, // NFTA_IMMEDIATE_DATA, its NFTA_DATA_VERDICT
	"counter":   {},
}

// dumpDefaults are attributes the kernel dumps that the rules we write
// leave at their default: bitwise's operation (NFTA_BITWISE_OP, boolean).
var dumpDefaults = map[string]map[string]string{
	"bitwise": {"6": "\x00\x00\x00\x00"},
}

func exprForms(fam plan.Family, list []byte) []exprForm {
	var out []exprForm
	for el := range nfnl.All(list) {
		f := exprForm{attrs: map[string]string{}}
		var data []byte
		for a := range nfnl.All(el.Value) {
			switch a.Type {
			case unix.NFTA_EXPR_NAME:
				f.name = a.String()
			case unix.NFTA_EXPR_DATA:
				data = a.Value
			}
		}
		if f.name != "counter" {
			flatten(f.attrs, "", data, nestedAttrs[f.name])
		}
		out = append(out, f)
	}
	return matchForms(fam, out)
}

// matchForms spells a rule's matches one way, whichever release of
// iptables-nft wrote them, so that a chain an iptables-restore of any
// release repaired compares equal to what the native writer writes
// (which writes as 1.8.7 does):
//   - a load of packet data, its mask and its comparison are one form,
//     without the register they pass through;
//   - the protocol is one form whether loaded as the packet's layer 4
//     protocol (1.8.7) or, on IPv4, as the header's protocol byte
//     (1.8.11);
//   - a destination port is one form whether the x_tables tcp or udp
//     match (1.8.7) or a load of the transport header's bytes 2–3 and a
//     cmp or range (1.8.8 and later);
//
// and ExprKey sorts the matches before the counter: they are a
// conjunction, and releases order them differently (1.8.11 puts the
// addresses first).
func matchForms(fam plan.Family, forms []exprForm) []exprForm {
	var out []exprForm
	for i := 0; i < len(forms); i++ {
		f := forms[i]
		if lo, hi, ok := xtPorts(f); ok {
			out = append(out, dportForm(lo, hi))
			continue
		}
		if m, n, ok := loadCompare(fam, forms[i:]); ok {
			out, i = append(out, m), i+n-1
			continue
		}
		out = append(out, f)
	}
	return out
}

// loadCompare reads a payload or meta load into a register, an optional
// mask of that register, and the cmp or range that judges it, as one
// form; n is how many expressions it took.
func loadCompare(fam plan.Family, forms []exprForm) (m exprForm, n int, ok bool) {
	load := forms[0]
	if load.name != "payload" && load.name != "meta" {
		return exprForm{}, 0, false
	}
	reg := load.attrs["1"] // NFTA_PAYLOAD_DREG, NFTA_META_DREG
	m = exprForm{name: "match", attrs: map[string]string{}}
	n = 1
	if n < len(forms) && forms[n].name == "bitwise" && forms[n].attrs["1"] == reg && forms[n].attrs["2"] == reg {
		for k, v := range forms[n].attrs {
			if k != "1" && k != "2" && dumpDefaults["bitwise"][k] != v {
				m.attrs["mask."+k] = v
			}
		}
		n++
	}
	if n >= len(forms) || (forms[n].name != "cmp" && forms[n].name != "range") || forms[n].attrs["1"] != reg {
		return exprForm{}, 0, false
	}
	c := forms[n]
	n++
	for k, v := range c.attrs {
		if k != "1" {
			m.attrs[c.name+"."+k] = v
		}
	}
	transport := load.name == "payload" && load.attrs["2"] == be32(unix.NFT_PAYLOAD_TRANSPORT_HEADER)
	switch {
	case load.name == "meta" && load.attrs["2"] == be32(unix.NFT_META_L4PROTO),
		fam == plan.IPv4 && load.name == "payload" && load.attrs["2"] == be32(unix.NFT_PAYLOAD_NETWORK_HEADER) &&
			load.attrs["3"] == be32(9) && load.attrs["4"] == be32(1):
		m.attrs["what"] = "l4proto"
	case transport && load.attrs["3"] == be32(2) && load.attrs["4"] == be32(2) && len(m.attrs) == 2 && m.attrs[c.name+".2"] == be32(0):
		// a destination port (cmp) or span (range) that equals
		if c.name == "cmp" {
			return dportForm(c.attrs["3.1"], c.attrs["3.1"]), n, true
		}
		return dportForm(c.attrs["3.1"], c.attrs["4.1"]), n, true
	default:
		for k, v := range load.attrs {
			if k != "1" {
				m.attrs[load.name+"."+k] = v
			}
		}
	}
	return m, n, true
}

// formKey spells a form as ExprKey does.
func formKey(e exprForm) string {
	paths := make([]string, 0, len(e.attrs))
	for p, v := range e.attrs {
		if dumpDefaults[e.name][p] != v {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	var b strings.Builder
	b.WriteString(e.name)
	for _, p := range paths {
		b.WriteString("|" + p + "=" + e.attrs[p])
	}
	return b.String()
}

// xtPorts reads the tcp or udp match of a destination port span with any
// source port and no flags: its ports in network order.
func xtPorts(f exprForm) (lo, hi string, ok bool) {
	info := []byte(f.attrs["3"])
	if f.name != "match" || (f.attrs["1"] != "tcp\x00" && f.attrs["1"] != "udp\x00") || f.attrs["2"] != be32(0) ||
		len(info) != portInfoLen || binary.NativeEndian.Uint16(info) != 0 || binary.NativeEndian.Uint16(info[2:]) != 0xffff || !isZero(info[8:]) {
		return "", "", false
	}
	port := func(b []byte) string {
		return string(binary.BigEndian.AppendUint16(nil, binary.NativeEndian.Uint16(b)))
	}
	return port(info[4:]), port(info[6:]), true
}

func dportForm(lo, hi string) exprForm {
	return exprForm{name: "dport", attrs: map[string]string{"lo": lo, "hi": hi}}
}

func be32(v uint32) string { return string(binary.BigEndian.AppendUint32(nil, v)) }

func flatten(m map[string]string, prefix string, b []byte, nested map[string]bool) {
	for a := range nfnl.All(b) {
		p := prefix + strconv.Itoa(int(a.Type))
		if nested[p] {
			flatten(m, p+".", a.Value, nested)
			continue
		}
		m[p] = string(a.Value)
	}
}

// sameAsWritten reports, without allocating, whether the dump of a
// rule's expressions is want expression for expression, attribute for
// attribute: what the kernel dumps of a rule the native writer wrote. The counter's
// values are the traffic's, and the dump has no nested flag, so a
// counter's data is not compared and the nested attributes are compared
// by their contents. Anything else (another order, another release's
// spelling) is false, and ExprKey judges it.
func sameAsWritten(dumped, want []byte) bool {
	next := func(b []byte) (name string, data, rest []byte, ok bool) {
		el, rest, ok := nextAttr(b)
		if !ok {
			return "", nil, nil, false
		}
		for a := range nfnl.All(el) {
			switch a.Type {
			case unix.NFTA_EXPR_NAME:
				name = a.String()
			case unix.NFTA_EXPR_DATA:
				data = a.Value
			}
		}
		return name, data, rest, true
	}
	for len(dumped) > 0 || len(want) > 0 {
		n1, d1, r1, ok1 := next(dumped)
		n2, d2, r2, ok2 := next(want)
		if !ok1 || !ok2 || n1 != n2 || (n1 != "counter" && !sameAttrs(d1, d2, "", nestedAttrs[n1])) {
			return false
		}
		dumped, want = r1, r2
	}
	return true
}

// sameAttrs compares two attribute lists in any order (the kernel dumps
// an expression's attributes in an order of its own), each type once,
// the nested ones (by path) by their contents.
func sameAttrs(a, b []byte, prefix string, nested map[string]bool) bool {
	count := 0
	for at := range nfnl.All(a) {
		vb, found := nfnl.Find(b, at.Type)
		p := prefix + strconv.Itoa(int(at.Type))
		if !found || (nested[p] && !sameAttrs(at.Value, vb, p+".", nested)) || (!nested[p] && !bytes.Equal(at.Value, vb)) {
			return false
		}
		count++
	}
	for range nfnl.All(b) {
		count--
	}
	return count == 0
}

// nextAttr splits off b's first attribute: its value, and what follows.
func nextAttr(b []byte) (value, rest []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := int(binary.NativeEndian.Uint16(b))
	if n < 4 || n > len(b) {
		return nil, nil, false
	}
	return b[4:n], b[min((n+3)&^3, len(b)):], true
}

// SameRules reports whether the kernel's dump of a chain's rules
// (NFTA_RULE_EXPRESSIONS of each) holds rules as EncodeRule writes them,
// each once: in order, or in any order when anyOrder; ErrNotNative when
// one of rules is not one it writes. Rules in the order given, as the
// native writer wrote them, are judged without allocating; otherwise
// each is spelled out (ExprKey), which any release's spelling of the
// same rule equals.
func SameRules(f plan.Family, dumped [][]byte, rules []Rule, chains map[string]bool, anyOrder bool) (bool, error) {
	want := make([][]byte, len(rules))
	asWritten := len(dumped) == len(rules)
	for i, r := range rules {
		e, _, _, err := EncodeRule(f, r, chains)
		if err != nil {
			return false, err
		}
		want[i] = e
		asWritten = asWritten && sameAsWritten(dumped[i], e)
	}
	if asWritten || len(dumped) != len(want) {
		return asWritten, nil
	}
	if !anyOrder {
		for i, e := range want {
			if !sameAsWritten(dumped[i], e) && ExprKey(f, dumped[i]) != ExprKey(f, e) {
				return false, nil
			}
		}
		return true, nil
	}
	count := make(map[string]int, len(want))
	for _, e := range want {
		count[ExprKey(f, e)]++
	}
	for _, d := range dumped {
		k := ExprKey(f, d)
		if count[k] == 0 {
			return false, nil
		}
		count[k]--
	}
	return true, nil
}

// ExprKey spells a rule's expressions as SameRules compares them: each
// form (matchForms) with its attributes by path, sorted, without the ones
// the kernel dumps at their default; the matches before the counter in
// sorted order.
func ExprKey(fam plan.Family, list []byte) string {
	forms := exprForms(fam, list)
	keys := make([]string, len(forms))
	end := len(forms)
	for i, e := range forms {
		keys[i] = formKey(e)
		if e.name == "counter" && end == len(forms) {
			end = i
		}
	}
	slices.Sort(keys[:end])
	return strings.Join(keys, ";")
}
