package nftables

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/plan"
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
// The attachment's chain stays as the record of its owner (its comment)
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

// Names the kernel keeps.
const (
	HostDNATMap   = "hostport_dnat"
	HostIPDNATMap = "hostip_hostport_dnat"
	// hairpinPrefix starts the names of the hairpin sets, which end with
	// the prefix length: hairpin_24, hostip_hairpin_24.
	hairpinPrefix       = "hairpin_"
	hostIPHairpinPrefix = "hostip_hairpin_"
	// flatMarkBit is the bit the dispatch chain's hairpin rules set.
	flatMarkBit = 13
	// flatMax is the most mappings a flat plan has.
	flatMax = 16
	// OwnersMap holds a goto to each flat attachment's chain.
	OwnersMap = "owners"
	// recordComment starts the comment of a flat attachment's record
	// rules; the key follows.
	recordComment = "record "
)

// isFlat reports whether p's attachment is flat.
func isFlat(p *plan.Plan) bool {
	if len(p.Conditions) > 0 || p.Mappings.Len() > flatMax {
		return false
	}
	if p.Masquerade.Enabled && p.Masquerade.MarkBit != flatMarkBit {
		return false
	}
	return !hasRanges(p)
}

func isDNATMap(name string) bool { return name == HostDNATMap || name == HostIPDNATMap }

// flatSetNames are the names of the DNAT maps and the hairpin sets of
// lengths.
func flatSetNames(lengths []int) []string {
	out := []string{OwnersMap, HostIPDNATMap, HostDNATMap}
	for _, l := range lengths {
		out = append(out, hairpinSet(true, l), hairpinSet(false, l))
	}
	return out
}

// hairpinSet names the hairpin set of a host IP kind and prefix length.
func hairpinSet(addr bool, ones int) string {
	if addr {
		return hostIPHairpinPrefix + strconv.Itoa(ones)
	}
	return hairpinPrefix + strconv.Itoa(ones)
}

// hairpinLength reads the prefix length out of a hairpin set's name.
func hairpinLength(name string) (addr bool, ones int, ok bool) {
	rest, addr := strings.CutPrefix(name, hostIPHairpinPrefix)
	if !addr {
		if rest, ok = strings.CutPrefix(name, hairpinPrefix); !ok {
			return false, 0, false
		}
	}
	n, err := strconv.Atoi(rest)
	return addr, n, err == nil && n >= 0 && n <= 128 && strconv.Itoa(n) == rest
}

// flatSets are the skeleton's DNAT maps and the hairpin sets of lengths.
func flatSets(lengths []int) []object {
	out := []object{ownersMapObj{}, dnatMapObj{name: HostIPDNATMap, addr: true}, dnatMapObj{name: HostDNATMap}}
	for _, addr := range []bool{true, false} {
		for _, l := range lengths {
			out = append(out, hairpinSetObj{addr: addr, ones: l})
		}
	}
	return out
}

// flatDispatchRules are the dispatch chain's rules for flat keys of one
// host IP kind: the hairpin marks of each prefix length, then the DNAT.
func flatDispatchRules(addr bool, lengths []int) []*Rule {
	dm := HostDNATMap
	if addr {
		dm = HostIPDNATMap
	}
	out := make([]*Rule, 0, len(lengths)+1)
	for _, l := range lengths {
		out = append(out, &Rule{Chain: DispatchChain, stmts: []stmt{hairpinLookup{addr: addr, ones: l}, markOr{1 << flatMarkBit}}})
	}
	return append(out, &Rule{Chain: DispatchChain, stmts: []stmt{dnatLookup{set: dm, addr: addr}}})
}

// lengthsOf are the prefix lengths of ps' hairpin sources, and of the
// hairpin lookups chain c (the dispatch chain, as read) holds: the
// lengths the skeleton keeps, longest first.
func lengthsOf(c *ChainState, ps ...*plan.Plan) []int {
	seen := map[int]bool{}
	if c != nil {
		for _, r := range c.Rules {
			if _, l, ok := hairpinLength(r.Member); ok {
				seen[l] = true
			}
		}
	}
	for _, p := range ps {
		for _, src := range hairpinSrcs(p) {
			if isFlat(p) {
				ones, _ := parsePrefix(src).Mask.Size()
				seen[ones] = true
			}
		}
	}
	out := make([]int, 0, len(seen))
	for l := range seen {
		out = append(out, l)
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// flatDispatchRule reports whether r is one of the dispatch chain's rules
// for flat keys: required only of a flat plan's skeleton, so that the
// attachments of a node set up before them pass CHECK.
func flatDispatchRule(r *Rule) bool {
	switch r.stmts[0].(type) {
	case hairpinLookup, dnatLookup:
		return true
	}
	return false
}

// targetOf is where p sends key k of one port: "192.0.2.2:80".
func targetOf(p *plan.Plan, k Key) string {
	for m := range p.Mappings.All() {
		if m.Protocol == k.Protocol && m.HostPort == k.Port && m.HostIP.Equal(k.HostIP) {
			return p.Target(m)
		}
	}
	return ""
}

// Hairpin is one element of a hairpin set: connections from Src (a
// prefix) to Key are marked for masquerading; Chain owns it.
type Hairpin struct {
	Src   string // a CIDR, "192.0.2.0/24", "127.0.0.1/32"
	Key   Key    // a flat key
	Chain string
}

// set is the hairpin set h lives in.
func (h Hairpin) set() string {
	ones, _ := parsePrefix(h.Src).Mask.Size()
	return hairpinSet(h.Key.HostIP != nil, ones)
}

// ID names the element: its set, source and key.
func (h Hairpin) ID() string { return h.set() + " " + h.Src + " . " + h.Key.String() }

// wantedHairpins are the hairpin elements of p's attachment: for each flat key,
// its hairpin source (the container's subnet, or every address with
// masqAll) and, where localhost connections are DNATed, 127.0.0.1.
func wantedHairpins(p *plan.Plan, keys []Key) []Hairpin {
	srcs := hairpinSrcs(p)
	chain := ChainName(p.Owner)
	out := make([]Hairpin, 0, len(srcs)*len(keys))
	for _, k := range keys {
		if !k.Flat {
			continue // a chain's rules mark its connections
		}
		for _, src := range srcs {
			out = append(out, Hairpin{Src: src, Key: k, Chain: chain})
		}
	}
	return out
}

// hairpinSrcs are the sources p's connections are masqueraded from, as
// CIDRs: its hairpin source and, where localhost connections are DNATed,
// 127.0.0.1.
func hairpinSrcs(p *plan.Plan) []string {
	if !p.Masquerade.Enabled || p.ContainerNet == nil {
		return nil
	}
	out := []string{parsePrefix(p.HairpinSource()).String()}
	if p.LocalhostRule() {
		out = append(out, "127.0.0.1/32")
	}
	return out
}

// hairpinsClaimed are the hairpin elements e's comment claims for its
// key (its owner's sources).
func hairpinsClaimed(e Element) []Hairpin {
	out := make([]Hairpin, 0, len(e.Srcs))
	for _, src := range e.Srcs {
		out = append(out, Hairpin{Src: src, Key: e.Key})
	}
	return out
}

// hairpinsOf reads the hairpin elements els' flat elements claim, and
// more.
func (b *Backend) hairpinsOf(els []Element, more ...Hairpin) ([]Hairpin, error) {
	points := more
	for _, e := range els {
		if e.Key.Flat {
			points = append(points, hairpinsClaimed(e)...)
		}
	}
	if len(points) == 0 {
		return nil, nil
	}
	found, err := b.Kernel.Hairpins(b.Family, points)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	out := found[:0]
	for _, h := range found {
		if !seen[h.ID()] {
			seen[h.ID()] = true
			out = append(out, h)
		}
	}
	return out, nil
}

// dnatMapObj declares a DNAT map: a key to an address and port.
type dnatMapObj struct {
	name string
	addr bool
}

// hairpinSetObj declares the hairpin set of a host IP kind and prefix
// length: a source masked to it, and a key.
type hairpinSetObj struct {
	addr bool
	ones int
}

// ownersMapObj declares the map of owners: a chain name's hashes to a
// goto to the chain.
type ownersMapObj struct{}

// ownerObj is chain's element of the owners map.
type ownerObj struct{ chain string }

// ownerKey is the owners map's key of chain, "dn-<16 hex>-<16 hex>": its
// hashes' 16 bytes; nil for a name of another shape.
func ownerKey(chain string) []byte {
	rest, ok := strings.CutPrefix(chain, "dn-")
	if !ok || len(rest) != 33 || rest[16] != '-' {
		return nil
	}
	b, err := hex.DecodeString(rest[:16] + rest[17:])
	if err != nil {
		return nil
	}
	return b
}

// recordRules are the rules of a flat attachment's chain that record its
// keys: each matches its key, and does nothing.
func recordRules(chain string, keys []Key) []*Rule {
	out := make([]*Rule, 0, len(keys))
	for _, k := range keys {
		stmts := []stmt{protoIs{k.Protocol}, dportIs{k.Port, 0}}
		if k.HostIP != nil {
			stmts = append(stmts, addrIs{dst: true, spec: k.HostIP.String()})
		}
		out = append(out, &Rule{Chain: chain, Comment: recordComment + k.String(), stmts: stmts})
	}
	return out
}

// splitRecord moves the chain's record rules, as read, into its Record.
func (c *ChainState) splitRecord() {
	rules := c.Rules[:0]
	for _, r := range c.Rules {
		s, ok := strings.CutPrefix(r.Comment, recordComment)
		if ok && r.Jump == "" && r.DNAT == "" && r.DNATMap == "" && r.Lookup == "" {
			if k, ok := parseKey(s); ok && !k.IsRange() {
				k.Flat = true
				c.Record, c.HasRecord = append(c.Record, k), true
				continue
			}
		}
		rules = append(rules, r)
	}
	c.Rules = rules
}

// dropRecord deletes what records a flat attachment beside its chain, as
// c was read: its owners element.
func dropRecord(tx *Tx, name string, c *ChainState) {
	if c != nil && c.Owned {
		tx.add(opDelete, ownerObj{name})
	}
}

// hairpinObj is one hairpin element; deleting needs no chain.
type hairpinObj struct{ h Hairpin }

func addrWord(f plan.Family) string {
	if f == plan.IPv6 {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

func addrLen(f plan.Family) uint32 {
	if f == plan.IPv6 {
		return 16
	}
	return 4
}

func (v dnatMapObj) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "map")
	b.WriteString(" " + v.name)
	if vb == opAdd || vb == opCreate {
		key := "inet_proto . inet_service"
		if v.addr {
			key = addrWord(tx.Family) + " . " + key
		}
		fmt.Fprintf(b, " { type %s : %s . inet_service ; }", key, addrWord(tx.Family))
	}
	b.WriteByte('\n')
}

// setDecl writes the attributes of a named set or map of ours; fields
// are the key's fields' lengths, each padded to 4 bytes in the key.
func setDecl(tx *Tx, a *nfnl.Attrs, name string, flags uint32, keyTypes, fields []uint32, data bool) {
	tx.nextID++
	var keyLen uint32
	for _, l := range fields {
		keyLen += (l + 3) &^ 3
	}
	a.String(unix.NFTA_SET_TABLE, tx.Table)
	a.String(unix.NFTA_SET_NAME, name)
	a.U32(unix.NFTA_SET_FLAGS, flags)
	a.U32(unix.NFTA_SET_KEY_TYPE, concatType(keyTypes...))
	a.U32(unix.NFTA_SET_KEY_LEN, keyLen)
	if data {
		a.U32(unix.NFTA_SET_DATA_TYPE, concatType(addrType(tx.Family), typeInetService))
		a.U32(unix.NFTA_SET_DATA_LEN, addrLen(tx.Family)+4)
	}
	a.U32(unix.NFTA_SET_ID, tx.nextID)
	if flags&unix.NFT_SET_INTERVAL != 0 {
		a.Nested(unix.NFTA_SET_DESC, func(a *nfnl.Attrs) {
			a.Nested(nftaSetDescConcat, func(a *nfnl.Attrs) {
				for _, l := range fields {
					a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) { a.U32(nftaSetFieldLen, l) })
				}
			})
		})
	}
	a.Raw(nftaSetUserdata, setUserdata(byteorderBig))
}

// keyShape is a key's types and field lengths as a set declares them:
// [host address .] protocol . port.
func keyShape(f plan.Family, addr bool) (types, lens []uint32) {
	types, lens = []uint32{typeInetProto, typeInetService}, []uint32{1, 2}
	if addr {
		types, lens = append([]uint32{addrType(f)}, types...), append([]uint32{addrLen(f)}, lens...)
	}
	return types, lens
}

func (v dnatMapObj) encode(tx *Tx, _ verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSET)
	types, lens := keyShape(tx.Family, v.addr)
	setDecl(tx, a, v.name, unix.NFT_SET_MAP, types, lens, true)
	return nil, nil
}

func (v hairpinSetObj) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "set")
	b.WriteString(" " + hairpinSet(v.addr, v.ones))
	if vb == opAdd || vb == opCreate {
		key := addrWord(tx.Family) + " . "
		if v.addr {
			key += addrWord(tx.Family) + " . "
		}
		fmt.Fprintf(b, " { type %sinet_proto . inet_service ; }", key)
	}
	b.WriteByte('\n')
}

func (v hairpinSetObj) encode(tx *Tx, _ verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSET)
	types, lens := keyShape(tx.Family, v.addr)
	types, lens = append([]uint32{addrType(tx.Family)}, types...), append([]uint32{addrLen(tx.Family)}, lens...)
	setDecl(tx, a, hairpinSet(v.addr, v.ones), 0, types, lens, false)
	return nil, nil
}

func (ownersMapObj) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "map")
	b.WriteString(" " + OwnersMap)
	if vb == opAdd || vb == opCreate {
		b.WriteString(" { type ipv6_addr : verdict ; }")
	}
	b.WriteByte('\n')
}

func (ownersMapObj) encode(tx *Tx, _ verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSET)
	setDecl(tx, a, OwnersMap, unix.NFT_SET_MAP, []uint32{typeIPv6Addr}, []uint32{16}, false)
	a.U32(unix.NFTA_SET_DATA_TYPE, dataVerdict)
	return nil, nil
}

func (v ownerObj) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "element")
	fmt.Fprintf(b, " %s { %s", OwnersMap, net.IP(ownerKey(v.chain)))
	if vb == opAdd || vb == opCreate {
		b.WriteString(" : goto " + v.chain)
	}
	b.WriteString(" }\n")
}

func (v ownerObj) encode(tx *Tx, vb verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	key := ownerKey(v.chain)
	if key == nil {
		return nil, fmt.Errorf("chain %q: not an attachment's name", v.chain)
	}
	target := v.chain
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSETELEM)
	if vb == opDelete {
		m.Type, target = nfnl.NftType(unix.NFT_MSG_DELSETELEM), ""
	}
	ownerAttrs(a, tx.Table, key, target)
	return nil, nil
}

// ownerAttrs names the owners map's element of key; with chain, its goto.
func ownerAttrs(a *nfnl.Attrs, table string, key []byte, chain string) {
	a.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	a.String(unix.NFTA_SET_ELEM_LIST_SET, OwnersMap)
	a.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
		a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
			dataValue(a, unix.NFTA_SET_ELEM_KEY, key)
			if chain != "" {
				a.Nested(unix.NFTA_SET_ELEM_DATA, func(a *nfnl.Attrs) { verdictAttr(a, unix.NFT_GOTO, chain) })
			}
		})
	})
}

// decodeOwners reads the chains of an owners map's GETSETELEM answer.
func decodeOwners(b []byte) []string {
	list, _ := nfnl.Find(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	var out []string
	for le := range nfnl.All(list) {
		data, _ := nfnl.Find(le.Value, unix.NFTA_SET_ELEM_DATA)
		v, _ := nfnl.Find(data, unix.NFTA_DATA_VERDICT)
		ch, _ := nfnl.Find(v, unix.NFTA_VERDICT_CHAIN)
		if chain, _, _ := strings.Cut(string(ch), "\x00"); chain != "" {
			out = append(out, chain)
		}
	}
	return out
}

// targetBytes is a target as a DNAT map's data holds it: the address,
// then the port padded to 4 bytes.
func targetBytes(f plan.Family, to string) []byte {
	ip, port := target(to)
	b := append([]byte(nil), ip.To16()...)
	if f == plan.IPv4 {
		b = append([]byte(nil), ip.To4()...)
	}
	return append(binary.BigEndian.AppendUint16(b, uint16(max(port, 0))), 0, 0)
}

func (v hairpinObj) text(tx *Tx, vb verb, b *strings.Builder) {
	head(b, tx, vb, "element")
	fmt.Fprintf(b, " %s { %s . %s", v.h.set(), parsePrefix(v.h.Src).IP, strings.Join(v.h.Key.Fields(), " . "))
	if (vb == opAdd || vb == opCreate) && v.h.Chain != "" {
		fmt.Fprintf(b, " comment %q", v.h.Chain)
	}
	b.WriteString(" }\n")
}

func (v hairpinObj) encode(tx *Tx, vb verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	m.Type = nfnl.NftType(unix.NFT_MSG_NEWSETELEM)
	if vb == opDelete {
		m.Type = nfnl.NftType(unix.NFT_MSG_DELSETELEM)
	}
	chain := v.h.Chain
	if vb == opDelete {
		chain = ""
	}
	hairpinAttrs(a, tx.Family, tx.Table, v.h, chain)
	return nil, nil
}

// hairpinAttrs names h's element: its source's network, its key; with
// owner, the comment naming its owner.
func hairpinAttrs(a *nfnl.Attrs, f plan.Family, table string, h Hairpin, owner string) {
	n := parsePrefix(h.Src)
	net := n.IP.Mask(n.Mask).To16()
	if f == plan.IPv4 {
		net = net.To4()
	}
	a.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	a.String(unix.NFTA_SET_ELEM_LIST_SET, h.set())
	a.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *nfnl.Attrs) {
		a.Nested(unix.NFTA_LIST_ELEM, func(a *nfnl.Attrs) {
			dataValue(a, unix.NFTA_SET_ELEM_KEY, h.Key.appendBytes(append([]byte(nil), net...)))
			if owner != "" {
				a.Raw(nftaSetElemUserdata, comment(owner))
			}
		})
	})
}

// hairpinLookup: ip saddr & 255.255.255.0 . [ip daddr .] meta l4proto .
// th dport @hairpin_24 — a connection from a source its hairpin set of
// that prefix length holds for its key.
type hairpinLookup struct {
	addr bool
	ones int
}

func (s hairpinLookup) set() string { return hairpinSet(s.addr, s.ones) }

// mask is the source's mask, nil for a full-length prefix.
func (s hairpinLookup) mask(f plan.Family) net.IPMask {
	bits := 8 * int(addrLen(f))
	if s.ones >= bits {
		return nil
	}
	return net.CIDRMask(s.ones, bits)
}

func (s hairpinLookup) text(f plan.Family) string {
	t := ipX(f) + " saddr "
	if m := s.mask(f); m != nil {
		t += "& " + net.IP(m).String() + " "
	}
	t += ". "
	if s.addr {
		t += ipX(f) + " daddr . "
	}
	return t + "meta l4proto . th dport @" + s.set()
}

func (s hairpinLookup) encode(e *exprs) {
	soff, length := addrOffset(e.fam, false)
	e.payload(unix.NFT_PAYLOAD_NETWORK_HEADER, soff, length, reg1)
	if m := s.mask(e.fam); m != nil {
		e.bitwise(reg1, []byte(m), make([]byte, length))
	}
	next := uint32(reg32) + length/4
	if s.addr {
		doff, _ := addrOffset(e.fam, true)
		e.payload(unix.NFT_PAYLOAD_NETWORK_HEADER, doff, length, next)
		next += length / 4
	}
	e.meta(unix.NFT_META_L4PROTO, next)
	e.payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, next+1)
	e.add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, s.set())
		a.U32(unix.NFTA_LOOKUP_SREG, reg1)
	})
}

// dnatLookup: dnat ip to [ip daddr .] meta l4proto . th dport map
// @hostport_dnat — the DNAT of every flat key of a host IP kind.
type dnatLookup struct {
	set  string
	addr bool
}

func (s dnatLookup) text(f plan.Family) string {
	t := "dnat " + ipX(f) + " to "
	if s.addr {
		t += ipX(f) + " daddr . "
	}
	return t + "meta l4proto . th dport map @" + s.set
}

func (s dnatLookup) encode(e *exprs) { dnatByMap(e, s.addr, s.set, 0) }

// dnatByMap loads [the destination address,] the protocol and the port,
// looks them up in set (an anonymous one by its id) and DNATs to the
// address and port it holds.
func dnatByMap(e *exprs, addr bool, set string, id uint32) {
	next := uint32(reg32)
	protoReg := uint32(reg1)
	if addr {
		offset, length := addrOffset(e.fam, true)
		e.payload(unix.NFT_PAYLOAD_NETWORK_HEADER, offset, length, reg1)
		next += length / 4
		protoReg = next
	}
	e.meta(unix.NFT_META_L4PROTO, protoReg)
	e.payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, next+1)
	fam, ipLen := uint32(unix.NFPROTO_IPV4), uint32(4)
	if e.fam == plan.IPv6 {
		fam, ipLen = unix.NFPROTO_IPV6, 16
	}
	e.add("lookup", func(a *nfnl.Attrs) {
		a.String(unix.NFTA_LOOKUP_SET, set)
		a.U32(unix.NFTA_LOOKUP_SREG, reg1)
		a.U32(unix.NFTA_LOOKUP_DREG, reg1)
		if id != 0 {
			a.U32(unix.NFTA_LOOKUP_SET_ID, id)
		}
	})
	e.add("nat", func(a *nfnl.Attrs) {
		a.U32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT)
		a.U32(unix.NFTA_NAT_FAMILY, fam)
		a.U32(unix.NFTA_NAT_REG_ADDR_MIN, reg1)
		// the port follows the address in the looked-up data; the kernel
		// takes the port as given when a register holds it, as nft writes
		a.U32(unix.NFTA_NAT_REG_PROTO_MIN, reg32+ipLen/4)
	})
}

// writeRecord makes the attachment's chain (created or flushed before)
// record keys and holds it in the owners map.
func writeRecord(tx *Tx, name string, keys []Key) {
	for _, r := range recordRules(name, keys) {
		tx.add(opAdd, r)
	}
	tx.add(opAdd, ownerObj{name})
}

// fastFlatTx is a flat ADD's fast path: create the attachment's chain
// with its record and its owners element (failing if they exist) and its
// elements (failing if one exists: another attachment holds the key, or
// the maps are missing).
func fastFlatTx(p *plan.Plan, keys []Key) *Tx {
	tx := newTx(p.Family)
	chain := ownChain(p)
	hps := wantedHairpins(p, keys)
	tx.ops = make([]op, 0, 2+2*len(keys)+len(hps))
	tx.add(opCreate, chain)
	for _, r := range recordRules(chain.name, keys) {
		tx.add(opAdd, r)
	}
	tx.add(opCreate, ownerObj{chain.name})
	srcs := hairpinSrcs(p)
	for _, k := range keys {
		tx.add(opCreate, elemObj{key: k, chain: chain.name, to: targetOf(p, k), srcs: srcs})
	}
	for _, h := range hps {
		tx.add(opCreate, hairpinObj{h})
	}
	return tx
}

// flatGuards are the shared chains a flat plan's fast path needs and does
// not itself touch: the masquerade chain of the dispatch chain's mark, and
// the guard where localhost connections are DNATed.
func flatGuards(p *plan.Plan) []string {
	var out []string
	if p.Masquerade.Enabled {
		out = append(out, MasqChain(flatMarkBit))
	}
	if p.LocalNet() {
		out = append(out, GuardChain)
	}
	return out
}

// judgeFlat says what of a flat attachment's chain and record is wrong,
// or "": its chain holds no rule but its record's, which holds p's keys,
// and the owners map holds it.
func judgeFlat(p *plan.Plan, c *ChainState) string {
	own := ChainName(p.Owner)
	if len(c.Rules) > 0 {
		return fmt.Sprintf("chain %s holds %d rules besides its record, want none (its keys are map elements)", own, len(c.Rules))
	}
	if !c.HasRecord {
		return fmt.Sprintf("chain %s records no key", own)
	}
	if !c.Owned {
		return fmt.Sprintf("map %s holds no element for chain %s", OwnersMap, own)
	}
	want := Keys(p)
	got := make(map[string]bool, len(c.Record))
	for _, k := range c.Record {
		got[k.ID()] = true
	}
	for _, k := range want {
		if !got[k.ID()] {
			return fmt.Sprintf("chain %s does not record %s", own, k)
		}
	}
	if len(c.Record) != len(want) {
		return fmt.Sprintf("chain %s records %d keys, want %d", own, len(c.Record), len(want))
	}
	return ""
}

// toString spells a DNAT map's data as a target: "192.0.2.2:80".
func toString(ip, port []byte) string {
	return net.JoinHostPort(net.IP(ip).String(), strconv.Itoa(int(binary.BigEndian.Uint16(port))))
}

// decodeHairpins reads the elements of a hairpin set's GETSETELEM answer.
func decodeHairpins(f plan.Family, b []byte) []Hairpin {
	attrs := nfnl.Parse(b)
	addr, ones, ok := hairpinLength(str(attrs, unix.NFTA_SET_ELEM_LIST_SET))
	if !ok {
		return nil
	}
	ipLen := int(addrLen(f))
	keySet := HostPortsMap
	if addr {
		keySet = HostIPPortsMap
	}
	list, _ := nfnl.Find(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	var out []Hairpin
	for le := range nfnl.All(list) {
		key := attrValue(le.Value, unix.NFTA_SET_ELEM_KEY)
		if len(key) < ipLen {
			continue
		}
		k, ok := keyFromBytes(f, keySet, key[ipLen:])
		if !ok {
			continue
		}
		k.Flat = true
		ud, _ := nfnl.Find(le.Value, nftaSetElemUserdata)
		out = append(out, Hairpin{Src: prefixString(net.IP(key[:ipLen]), ones, ipLen*8), Key: k, Chain: commentOf(ud)})
	}
	return out
}
