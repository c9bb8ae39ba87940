package iptables

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// Names the kernel keeps. They are the upstream portmap plugin's names, so a
// node can switch between the two plugins without leaking rules: never change
// them, or upgrades need manual intervention.
const (
	Table             = "nat"
	TopLevelDNATChain = "CNI-HOSTPORT-DNAT"
	SetMarkChain      = "CNI-HOSTPORT-SETMARK"
	masqChain         = "CNI-HOSTPORT-MASQ"
	// GuardChain (filter table, IPv4) drops connections to 127.0.0.0/8
	// that arrive from outside: route_localnet, which localhost host ports
	// need, would otherwise let a container or a neighbour reach services
	// the host binds to 127.0.0.1 (the CVE-2020-8558 class of bug).
	GuardChain       = "CNI-HOSTPORT-GUARD"
	guardComment     = "CNI portmap: no 127.0.0.0/8 from outside"
	setMarkComment   = "CNI portfwd masquerade mark"
	masqEntryComment = "CNI portfwd requiring masquerade"
	dnChainPrefix    = "DN-"
	// dnChain starts every attachment's chain name.
	dnChain = "CNI-" + dnChainPrefix
	// maxComment is the xt_comment limit (256 with the NUL).
	maxComment = 255
)

// Names the kernel keeps for forwardAccept: never change them.
const (
	FilterTable        = "filter"
	forwardChain       = "CNI-HOSTPORT-FWD"
	forwardChainPrefix = "FW-"
)

// ChainName is the attachment's own chain: upstream's hash of network name
// and container ID.
func ChainName(o plan.Owner) string { return chainName(o, dnChainPrefix) }

// chainName is the chain upstream names for an attachment with prefix
// (its plugins' utils.MustFormatChainNameWithPrefix, which a test holds
// this to): "CNI-", the prefix, then the hex SHA-512 of network name and
// container ID, 28 characters in all.
func chainName(o plan.Owner, prefix string) string {
	sum := sha512.Sum512([]byte(o.Network + o.ContainerID))
	return ("CNI-" + prefix + hex.EncodeToString(sum[:]))[:28]
}

// entryComment is the comment on the attachment's entry rules, upstream's
// format; GC and `list` read the owner back from it.
func entryComment(o plan.Owner) string {
	// skel allows only [A-Za-z0-9_.-] in both; anything else (which could
	// end the payload's line) is replaced, never written.
	c := fmt.Sprintf(`dnat name: "%s" id: "%s"`, printable(o.Network), printable(o.ContainerID))
	if len(c) > maxComment {
		c = c[:maxComment-3] + "..." // upstream cuts at 253+3, one past the limit
	}
	return c
}

func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == '"' || r == '\\' {
			return '?'
		}
		return r
	}, s)
}

// sharedChains are the chains every attachment of the plan's kind relies on,
// in creation order.
func sharedChains(p *plan.Plan) []xt.Chain {
	chains := []xt.Chain{{Table: Table, Name: TopLevelDNATChain}}
	if ownMarkChains(p) {
		chains = append(chains, xt.Chain{Table: Table, Name: SetMarkChain}, xt.Chain{Table: Table, Name: masqChain})
	}
	if p.LocalNet() {
		chains = append(chains, xt.Chain{Table: "filter", Name: GuardChain})
	}
	return chains
}

// GuardRules are the filter-table rules of the localhost guard: at the top
// of INPUT, drop what comes to 127.0.0.0/8 on another interface than lo
// unless conntrack knows it (replies) or we DNATed it.
func GuardRules(p *plan.Plan) []xt.Rule {
	if !p.LocalNet() {
		return nil
	}
	return []xt.Rule{
		{Table: "filter", Chain: "INPUT", Jump: GuardChain, Insert: true},
		{Table: "filter", Chain: GuardChain, Dst: "127.0.0.0/8", Matches: []string{"!", "-i", "lo",
			"-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT"}, Comment: guardComment, Jump: "DROP"},
	}
}

// sharedRules are the rules outside the attachment's chain that ADD ensures
// exist exactly once: the jumps from the built-in chains and the mark and
// masquerade rules.
func sharedRules(p *plan.Plan) []xt.Rule {
	local := []string{"-m", "addrtype", "--dst-type", "LOCAL"}
	rules := []xt.Rule{
		{Chain: "PREROUTING", Matches: local, Jump: TopLevelDNATChain},
		{Chain: "OUTPUT", Matches: local, Jump: TopLevelDNATChain},
	}
	if ownMarkChains(p) {
		mark := markSpec(p.Masquerade)
		rules = append(rules,
			xt.Rule{Chain: SetMarkChain, Comment: setMarkComment, Jump: "MARK", SetXmark: mark},
			xt.Rule{Chain: masqChain, Matches: []string{"-m", "mark", "--mark", mark}, Jump: "MASQUERADE"},
			// At the top of POSTROUTING: the ptp and bridge plugins' own
			// masquerade rules would otherwise take the packet first.
			xt.Rule{Chain: "POSTROUTING", Comment: masqEntryComment, Jump: masqChain, Insert: true},
		)
	}
	return rules
}

// EntryRules are the attachment's rules in CNI-HOSTPORT-DNAT: one per
// protocol and group of up to 15 multiport slots (a port takes one, a
// range "first:last" two), carrying the owner comment and the configured
// conditions.
func EntryRules(p *plan.Plan) []xt.Rule {
	byProto := map[plan.Protocol][]string{}
	seen := map[string]bool{}
	for _, r := range p.Runs() {
		spec := r.Ports(":")
		if k := string(r.Protocol) + "/" + spec; !seen[k] {
			seen[k] = true
			byProto[r.Protocol] = append(byProto[r.Protocol], spec)
		}
	}
	comment := entryComment(p.Owner)
	var rules []xt.Rule
	for _, proto := range plan.Protocols {
		specs := byProto[proto]
		for len(specs) > 0 {
			n, slots := 0, 0
			for n < len(specs) && slots+xt.MultiportSlots(specs[n]) <= xt.MaxMultiport {
				slots += xt.MultiportSlots(specs[n])
				n++
			}
			rules = append(rules, xt.Rule{Chain: TopLevelDNATChain, Insert: true, Comment: comment, Proto: proto,
				Dports: strings.Join(specs[:n], ","), Matches: p.Conditions, Jump: ChainName(p.Owner)})
			specs = specs[n:]
		}
	}
	return rules
}

// ChainRules are the rules of the attachment's own chain: per run of
// mappings (plan.Runs; most often one mapping), mark hairpin and (IPv4)
// localhost connections for masquerading, then DNAT. The mark rules must
// come before the DNAT rule, which ends the traversal.
func ChainRules(p *plan.Plan) []xt.Rule {
	chain := ChainName(p.Owner)
	setMark := setMarkChainOf(p)
	var rules []xt.Rule
	for _, r := range p.Runs() {
		base := xt.Rule{Chain: chain, Proto: r.Protocol, Dport: r.Ports(":")}
		if r.HostIP != nil {
			base.Dst = r.HostIP.String()
		}
		if p.Masquerade.Enabled {
			hairpin := base
			hairpin.Src, hairpin.Jump = p.HairpinSource(), setMark
			rules = append(rules, hairpin)
			if p.LocalhostRule() {
				hairpin.Src = "127.0.0.1"
				rules = append(rules, hairpin)
			}
		}
		dnat := base
		dnat.Jump, dnat.To = "DNAT", runTarget(p, r)
		rules = append(rules, dnat)
	}
	return rules
}

// setMarkChainOf is the chain the plan's hairpin rules jump to.
func setMarkChainOf(p *plan.Plan) string {
	if p.Masquerade.ExternalSetMarkChain != "" {
		return p.Masquerade.ExternalSetMarkChain
	}
	return SetMarkChain
}

// runTarget is the DNAT target of a run: the container's address and port
// for one mapping, as upstream writes it; for a range, the address alone
// when every port keeps its number, else the container's port range with
// the first host port as base, which keeps the offset
// (NF_NAT_RANGE_PROTO_OFFSET: "192.0.2.2:80-90/8000").
func runTarget(p *plan.Plan, r plan.Run) string {
	ip := p.ContainerNet.IP.String()
	switch {
	case r.Len == 1:
		return net.JoinHostPort(ip, strconv.Itoa(r.ContainerPort))
	case r.Identity():
		return ip
	}
	if p.Family == plan.IPv6 {
		ip = "[" + ip + "]"
	}
	return fmt.Sprintf("%s:%d-%d/%d", ip, r.ContainerPort, r.ContainerPortOf(r.Last()), r.HostPort)
}

// MarkerChain is an empty nat chain that exists once the mark and
// masquerade rules of bit have been ensured: the slow path makes it after
// them. ADD's fast path flushes it — a no-op that fails while it is
// missing — instead of checking those rules with -C: any -C in the
// restore that also inserts into CNI-HOSTPORT-DNAT makes iptables-nft
// fetch every rule of that chain, which grows with the number of
// attachments. One per bit, so an attachment with another markMasqBit
// never takes a node's skeleton for its own.
func MarkerChain(bit int) string { return fmt.Sprintf("CNI-HOSTPORT-BIT%d", bit) }

// Marker is the plan's marker chain, when it masquerades with this
// layout's mark chains.
func Marker(p *plan.Plan) (xt.Chain, bool) {
	if !ownMarkChains(p) {
		return xt.Chain{}, false
	}
	return xt.Chain{Table: Table, Name: MarkerChain(p.Masquerade.MarkBit)}, true
}

// ownMarkChains reports whether p uses the SETMARK and MASQ chains of this
// layout (masquerading without an externalSetMarkChain).
func ownMarkChains(p *plan.Plan) bool {
	return p.Masquerade.Enabled && p.Masquerade.ExternalSetMarkChain == ""
}

func markSpec(m plan.Masquerade) string {
	return fmt.Sprintf("%#x/%#x", m.Mark(), m.Mark())
}

// skeletonRules are the shared rules ADD of plans like p makes.
func skeletonRules(p *plan.Plan) []xt.Rule {
	q := *p
	q.Conditions = nil // the shared rules alone
	return append(GuardRules(&q), sharedRules(&q)...)
}

// entryOwnerRE reads the owner back from an entry rule as iptables -S
// prints it: --comment "dnat name: \"net\" id: \"cid\"" ... -j CNI-DN-...
// (or CNI-FW-... in the filter table).
var entryOwnerRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`--comment "dnat name: \\"([^"\\]*)\\" id: \\"([^"\\]*)\\"".* -j \S+$`)
})
