package nftables

import (
	"fmt"
	"strings"
	"sync"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// Check verifies that everything ADD made is there, reading only the
// shared chains and the attachment's own chain and keys. nft 1.0.6
// mis-answers a script that lists several objects ("No such file or
// directory" for the first) and takes long to print a whole table of a
// thousand attachments, so each object is listed by its own nft process;
// they run at once.
func (b *Backend) Check(p *plan.Plan) error {
	fam := nftFamily(b.Family)
	skel := skeletonRules(p)
	own := ChainName(p.Owner)
	type read struct {
		what, cmd string
		out       string
		err       error
	}
	var reads []*read
	for _, c := range append(skeletonOrder(skel), own) {
		reads = append(reads, &read{what: "chain " + c, cmd: fmt.Sprintf("list chain %s %s %s\n", fam, Table, c)})
	}
	byMap := map[string][]string{}
	for _, k := range Keys(p) {
		byMap[k.Map()] = append(byMap[k.Map()], k.String())
	}
	for _, m := range []string{HostPortsMap, HostIPPortsMap} {
		if len(byMap[m]) > 0 {
			reads = append(reads, &read{what: "elements " + strings.Join(byMap[m], ", ") + " of map " + m,
				cmd: fmt.Sprintf("get element %s %s %s { %s }\n", fam, Table, m, strings.Join(byMap[m], ", "))})
		}
	}
	var wg sync.WaitGroup
	for _, r := range reads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.out, r.err = b.Kernel.Run(r.cmd)
		}()
	}
	wg.Wait()
	var all strings.Builder
	for _, r := range reads {
		if IsNotFound(r.err) {
			return fmt.Errorf("%s: missing %s in table %s %s", b.Family, r.what, fam, Table)
		}
		if r.err != nil {
			return fmt.Errorf("%s: check %s: %w", b.Family, r.what, r.err)
		}
		all.WriteString(r.out)
	}
	out := all.String()
	chains := splitChains(out)
	for _, c := range skeletonOrder(skel) {
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
		want := "dnat to " + p.Target(m)
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
	case strings.HasPrefix(rule, "meta mark set"):
		return "meta mark set"
	case rule == guardRule:
		return "ip daddr 127.0.0.0/8"
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
