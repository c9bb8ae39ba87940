package nftables

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Check verifies, in one nft process and reading only the shared chains and
// the attachment's own chain and keys, that everything ADD made is there.
func (b *Backend) Check(p *plan.Plan) error {
	fam := nftFamily(b.Family)
	skel := skeletonRules(p)
	var script strings.Builder
	names := sortedKeys(skel)
	for _, c := range names {
		fmt.Fprintf(&script, "list chain %s %s %s\n", fam, Table, c)
	}
	own := ChainName(p.Owner)
	fmt.Fprintf(&script, "list chain %s %s %s\n", fam, Table, own)
	byMap := map[string][]string{}
	for _, k := range Keys(p) {
		byMap[k.Map()] = append(byMap[k.Map()], k.String())
	}
	for _, m := range []string{HostPortsMap, HostIPPortsMap} {
		if len(byMap[m]) > 0 {
			fmt.Fprintf(&script, "get element %s %s %s { %s }\n", fam, Table, m, strings.Join(byMap[m], ", "))
		}
	}
	out, err := b.Kernel.Run(script.String())
	if err != nil {
		var ne *Error
		if errors.As(err, &ne) {
			if m := failedCmdRE.FindStringSubmatch(ne.Output); m != nil {
				return fmt.Errorf("%s: missing in table %s %s: %s", b.Family, fam, Table, strings.TrimSpace(m[1]))
			}
		}
		return fmt.Errorf("%s: check: %w", b.Family, err)
	}
	chains := splitChains(out)
	for _, c := range names {
		for _, r := range skel[c] {
			if !strings.Contains(chains[c], signature(r)) {
				return fmt.Errorf("%s: missing rule %q in chain %s", b.Family, r, c)
			}
		}
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

// failedCmdRE finds the command nft reports after an error.
var failedCmdRE = regexp.MustCompile(`Error: [^\n]*\n([^\n]+)`)

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
