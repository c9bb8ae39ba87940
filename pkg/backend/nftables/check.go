package nftables

import (
	"fmt"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Check verifies that everything ADD made is there, in one nft process.
// It lists the whole table: nft 1.0.6 mis-answers scripts that list
// several objects ("No such file or directory" for the first), and every
// nft invocation fetches the table's chains anyway.
func (b *Backend) Check(p *plan.Plan) error {
	fam := nftFamily(b.Family)
	out, err := b.Kernel.Run(fmt.Sprintf("list table %s %s\n", fam, Table))
	if notFound(err) {
		return fmt.Errorf("%s: missing table %s %s", b.Family, fam, Table)
	}
	if err != nil {
		return fmt.Errorf("%s: check: %w", b.Family, err)
	}
	chains := splitChains(out)
	skel := skeletonRules(p)
	for _, c := range sortedKeys(skel) {
		text, ok := chains[c]
		if !ok {
			return fmt.Errorf("%s: missing chain %s in table %s %s", b.Family, c, fam, Table)
		}
		for _, r := range skel[c] {
			if !strings.Contains(text, signature(r)) {
				return fmt.Errorf("%s: missing rule %q in chain %s", b.Family, r, c)
			}
		}
	}
	own := ChainName(p.Owner)
	if _, ok := chains[own]; !ok {
		return fmt.Errorf("%s: missing chain %s (the attachment's own) in table %s %s", b.Family, own, fam, Table)
	}
	for _, r := range chainRules(p) {
		if !strings.Contains(chains[own], `comment "`+*r.Comment+`"`) {
			return fmt.Errorf("%s: missing rule %q in chain %s", b.Family, *r.Comment, own)
		}
	}
	for _, m := range p.Mappings {
		want := "dnat to " + dnatTarget(p.ContainerNet.IP, m.ContainerPort)
		k := Key{HostIP: m.HostIP, Protocol: m.Protocol, Port: m.HostPort}
		if !lineWith(chains[own], `comment "`+keyComment+k.String()+`"`, want) {
			return fmt.Errorf("%s: rule for %s in chain %s does not %s", b.Family, k, own, want)
		}
	}
	holders := parseMaps(out)
	for _, k := range Keys(p) {
		if h := holders[k.Map()+" "+k.String()]; h != own {
			return fmt.Errorf("%s: map %s sends %s to %q, not to %s", b.Family, k.Map(), k, h, own)
		}
	}
	return nil
}

// signature is the part of a shared rule that nft prints as we wrote it
// (it rewrites marks as 0x00002000, for instance).
func signature(rule string) string {
	switch {
	case strings.Contains(rule, "vmap"):
		return rule[strings.Index(rule, "vmap"):]
	case strings.HasSuffix(rule, "masquerade"):
		return "masquerade"
	}
	return rule
}

// splitChains maps chain names to their listed text.
func splitChains(out string) map[string]string {
	chains := map[string]string{}
	current := ""
	for _, line := range strings.Split(out, "\n") {
		if m := chainHeaderRE.FindStringSubmatch(line); m != nil {
			current = m[1]
			continue
		}
		if current != "" {
			chains[current] += line + "\n"
		}
		if strings.TrimSpace(line) == "}" {
			current = ""
		}
	}
	return chains
}

func lineWith(text string, parts ...string) bool {
	for _, l := range strings.Split(text, "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			return true
		}
	}
	return false
}
