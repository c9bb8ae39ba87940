package nftables

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Names the kernel keeps: never change them, or upgrades need manual
// intervention. Our own table, not upstream's cni_hostport, so both can
// coexist during a migration.
const (
	Table          = "cni_portmap"
	HostPortsMap   = "hostports"
	HostIPPortsMap = "hostip_hostports"
	DispatchChain  = "dispatch"
	tableComment   = "CNI portmap: host ports to containers"
	// Rule comments that name what a rule is for; the "hostport" ones
	// record the map keys an attachment claims, so DEL needs no other
	// state than its own chain.
	keyComment       = "hostport "
	hairpinComment   = "hairpin "
	localhostComment = "localhost "
)

// UpstreamTable is the upstream plugin's nftables table; DEL cleans it of
// the container's rules.
const UpstreamTable = "cni_hostport"

func nftFamily(f plan.Family) knftables.Family {
	if f == plan.IPv6 {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// ipX is the family's address expression keyword.
func ipX(f plan.Family) string {
	if f == plan.IPv6 {
		return "ip6"
	}
	return "ip"
}

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}

// NetworkPrefix starts the chain name of every attachment of network, so
// GC can pick one network's chains by name.
func NetworkPrefix(network string) string { return "dn-" + shortHash(network) + "-" }

// ChainName is the attachment's own chain: hashes of the network and of
// ifname:containerID, as the plugins' ipmasq nftables code names its chains.
func ChainName(o plan.Owner) string {
	return NetworkPrefix(o.Network) + shortHash(o.IfName+":"+o.ContainerID)
}

// MasqChain is the postrouting chain that masquerades connections marked
// with bit: one per mark bit in use, so attachments with different
// markMasqBit settings do not undo each other.
func MasqChain(bit int) string { return fmt.Sprintf("masquerade-bit%d", bit) }

// GuardChain (IPv4, filter input hook) drops connections to 127.0.0.0/8
// that arrive from outside: route_localnet, which localhost host ports
// need, would otherwise let a container or a neighbour reach services the
// host binds to 127.0.0.1 (the CVE-2020-8558 class of bug).
const GuardChain = "guard"

const guardRule = `iifname != "lo" ip daddr 127.0.0.0/8 ct state != { established, related } ct status & dnat == 0 drop`

// MarkChain sets the masquerade mark bit; attachments jump to it, which
// also makes their fast-path ADD fail (and the slow path write the
// skeleton) while the skeleton for that bit is missing.
func MarkChain(bit int) string { return fmt.Sprintf("mark-bit%d", bit) }

// Key is a map key an attachment claims: (host IP,) protocol, host port.
type Key struct {
	HostIP   net.IP // nil: the wildcard map
	Protocol plan.Protocol
	Port     int
}

// Map is the map the key lives in.
func (k Key) Map() string {
	if k.HostIP != nil {
		return HostIPPortsMap
	}
	return HostPortsMap
}

// Fields are the key's concatenation, as nft prints it.
func (k Key) Fields() []string {
	f := []string{string(k.Protocol), strconv.Itoa(k.Port)}
	if k.HostIP != nil {
		f = append([]string{k.HostIP.String()}, f...)
	}
	return f
}

func (k Key) String() string { return strings.Join(k.Fields(), " . ") }

// Keys are the map keys of the plan, in mapping order.
func Keys(p *plan.Plan) []Key {
	out := make([]Key, 0, len(p.Mappings))
	for _, m := range p.Mappings {
		out = append(out, Key{HostIP: m.HostIP, Protocol: m.Protocol, Port: m.HostPort})
	}
	return out
}

// parseKey reads a key back from its String form.
func parseKey(s string) (Key, bool) {
	f := strings.Split(s, " . ")
	var k Key
	if len(f) == 3 {
		if k.HostIP = net.ParseIP(f[0]); k.HostIP == nil {
			return k, false
		}
		if v4 := k.HostIP.To4(); v4 != nil {
			k.HostIP = v4
		}
		f = f[1:]
	}
	if len(f) != 2 {
		return k, false
	}
	proto, ok := plan.ParseProtocol(f[0])
	port, err := strconv.Atoi(f[1])
	if !ok || f[0] == "" || err != nil {
		return k, false
	}
	k.Protocol, k.Port = proto, port
	return k, true
}

func newTx(f plan.Family) *knftables.Transaction {
	return knftables.NewFake(nftFamily(f), Table).NewTransaction()
}

type baseChain struct {
	name     string
	hook     knftables.BaseChainHook
	priority knftables.BaseChainPriority
}

// baseChains are the hooks of the skeleton; both jump to dispatch for
// packets to a local address.
var baseChains = []baseChain{
	{"prerouting", knftables.PreroutingHook, knftables.DNATPriority},
	{"output", knftables.OutputHook, knftables.DNATPriority},
}

// skeletonRules lists each shared chain with its exact rules.
func skeletonRules(p *plan.Plan) map[string][]string {
	ip := ipX(p.Family)
	rules := map[string][]string{
		DispatchChain: {
			ip + " daddr . meta l4proto . th dport vmap @" + HostIPPortsMap,
			"meta l4proto . th dport vmap @" + HostPortsMap,
		},
	}
	for _, bc := range baseChains {
		rules[bc.name] = []string{"fib daddr type local jump " + DispatchChain}
	}
	if marksOwnBit(p) {
		mark := fmt.Sprintf("%#x", p.Masquerade.Mark())
		rules[MasqChain(p.Masquerade.MarkBit)] = []string{"meta mark & " + mark + " == " + mark + " masquerade"}
		rules[MarkChain(p.Masquerade.MarkBit)] = []string{"meta mark set meta mark | " + mark}
	}
	if p.LocalNet() {
		rules[GuardChain] = []string{guardRule}
	}
	return rules
}

// marksOwnBit reports whether p needs this table's mark-bitN and
// masquerade-bitN chains (nftables has no external mark chain).
func marksOwnBit(p *plan.Plan) bool { return p.Masquerade.Enabled }

// addSkeleton writes the table, maps and shared chains, idempotently: the
// shared chains are flushed and refilled with their fixed rules, which also
// repairs them.
func addSkeleton(tx *knftables.Transaction, p *plan.Plan) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(tableComment)})
	addrType := "ipv4_addr"
	if p.Family == plan.IPv6 {
		addrType = "ipv6_addr"
	}
	tx.Add(&knftables.Map{Name: HostPortsMap, Type: "inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Map{Name: HostIPPortsMap, Type: addrType + " . inet_proto . inet_service : verdict"})
	rules := skeletonRules(p)
	tx.Add(&knftables.Chain{Name: DispatchChain})
	if marksOwnBit(p) {
		tx.Add(&knftables.Chain{Name: MarkChain(p.Masquerade.MarkBit)})
	}
	for _, bc := range baseChains {
		tx.Add(&knftables.Chain{Name: bc.name, Type: knftables.PtrTo(knftables.NATType),
			Hook: knftables.PtrTo(bc.hook), Priority: knftables.PtrTo(bc.priority)})
	}
	if marksOwnBit(p) {
		tx.Add(&knftables.Chain{Name: MasqChain(p.Masquerade.MarkBit), Type: knftables.PtrTo(knftables.NATType),
			Hook: knftables.PtrTo(knftables.PostroutingHook), Priority: knftables.PtrTo(knftables.SNATPriority)})
	}
	if p.LocalNet() {
		tx.Add(&knftables.Chain{Name: GuardChain, Type: knftables.PtrTo(knftables.FilterType),
			Hook: knftables.PtrTo(knftables.InputHook), Priority: knftables.PtrTo(knftables.FilterPriority)})
	}
	for _, name := range skeletonOrder(rules) {
		tx.Flush(&knftables.Chain{Name: name})
		for _, r := range rules[name] {
			tx.Add(&knftables.Rule{Chain: name, Rule: r})
		}
	}
}

// skeletonOrder lists the shared chains of m in the order they are
// written: base chains, dispatch, guard, then the masquerade and mark
// chains of each bit in use.
func skeletonOrder(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for _, k := range []string{"prerouting", "output", DispatchChain, GuardChain} {
		if _, ok := m[k]; ok {
			out = append(out, k)
		}
	}
	for k := range m {
		if strings.HasPrefix(k, "masquerade-") {
			out = append(out, k)
		}
	}
	for k := range m {
		if strings.HasPrefix(k, "mark-") {
			out = append(out, k)
		}
	}
	return out
}

// OwnerComment is the attachment chain's comment: who owns it (nft allows
// 128 characters; longer names are cut, the chain name stays exact).
func OwnerComment(o plan.Owner) string {
	c := fmt.Sprintf("net=%s id=%s if=%s", o.Network, o.ContainerID, o.IfName)
	if len(c) > 128 {
		c = c[:128]
	}
	return c
}

// chainRules are the rules of the attachment's chain: per mapping, the
// conditions, then mark hairpin and (IPv4) localhost connections for
// masquerading, then DNAT. Each rule's comment says what it is for.
func chainRules(p *plan.Plan) []*knftables.Rule {
	chain := ChainName(p.Owner)
	ip := ipX(p.Family)
	conds := strings.Join(p.Conditions, " ")
	var rules []*knftables.Rule
	for _, m := range p.Mappings {
		k := Key{HostIP: m.HostIP, Protocol: m.Protocol, Port: m.HostPort}
		match := knftables.Concat(conds, "meta l4proto", string(m.Protocol), "th dport", m.HostPort)
		if m.HostIP != nil {
			match = knftables.Concat(match, ip, "daddr", m.HostIP)
		}
		if p.Masquerade.Enabled {
			setMark := "jump " + MarkChain(p.Masquerade.MarkBit)
			rules = append(rules, &knftables.Rule{Chain: chain,
				Rule:    knftables.Concat(match, ip, "saddr", p.HairpinSource(), setMark),
				Comment: knftables.PtrTo(hairpinComment + k.String())})
			if p.LocalhostRule() {
				rules = append(rules, &knftables.Rule{Chain: chain,
					Rule:    knftables.Concat(match, ip, "saddr 127.0.0.1", setMark),
					Comment: knftables.PtrTo(localhostComment + k.String())})
			}
		}
		rules = append(rules, &knftables.Rule{Chain: chain,
			Rule:    knftables.Concat(match, "dnat to", p.Target(m)),
			Comment: knftables.PtrTo(keyComment + k.String())})
	}
	return rules
}

func verdict(o plan.Owner) []string { return []string{"goto " + ChainName(o)} }

func ownChain(p *plan.Plan) *knftables.Chain {
	return &knftables.Chain{Name: ChainName(p.Owner), Comment: knftables.PtrTo(OwnerComment(p.Owner))}
}

// fastAddTx is ADD's fast path: create the attachment's chain (failing if
// it exists), fill it, and add its map elements (failing if another
// attachment holds a key, or the maps are missing).
func fastAddTx(p *plan.Plan) *knftables.Transaction {
	tx := newTx(p.Family)
	tx.Create(ownChain(p))
	for _, r := range chainRules(p) {
		tx.Add(r)
	}
	for _, k := range Keys(p) {
		tx.Add(&knftables.Element{Map: k.Map(), Key: k.Fields(), Value: verdict(p.Owner)})
	}
	return tx
}

// AddScript is the nft script of ADD's fast path for p, and the number of
// commands it must hold (for tests and fuzzing of the rendering).
func AddScript(p *plan.Plan) (script string, commands int) {
	tx := fastAddTx(p)
	return tx.String(), tx.NumOperations()
}
