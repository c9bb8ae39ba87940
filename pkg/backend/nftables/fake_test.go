package nftables

import (
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// fakeKernel is an nf_tables without a kernel: reads answer from canned
// `nft -a list table` text (a table or chain absent from it is not found),
// and every transaction is recorded as the nft script it renders; a
// transaction for which fail says true fails as the kernel would
// (EEXIST), leaving the canned text as it was.
type fakeKernel struct {
	tables  map[string]string // "ip cni_portmap" -> nft -a list output
	scripts []string
	checks  []string
	fail    func(script string) bool
	// errno, when set, is what a failing transaction fails with (EEXIST
	// when not).
	errno unix.Errno
	// chainReads counts the reads of one chain.
	chainReads int
	// probes counts Writable's calls; notWritable is their answer.
	probes      int
	notWritable error
}

func (k *fakeKernel) Apply(tx *Tx) error {
	s := tx.Text()
	k.scripts = append(k.scripts, s)
	if k.fail != nil && k.fail(s) {
		errno := k.errno
		if errno == 0 {
			errno = unix.EEXIST
		}
		return &Error{Op: tx.String(), Err: errno}
	}
	return nil
}

func (k *fakeKernel) Writable(plan.Family) error {
	k.probes++
	return k.notWritable
}

func (k *fakeKernel) Validate(tx *Tx) error {
	k.checks = append(k.checks, tx.Text())
	return nil
}

func (k *fakeKernel) Table(f plan.Family, table string) (*State, error) {
	out, ok := k.tables[string(nftFamily(f))+" "+table]
	if !ok {
		return nil, nil
	}
	return parseListing(f, out), nil
}

func (k *fakeKernel) Chain(f plan.Family, table, chain string) (*ChainState, error) {
	k.chainReads++
	s, _ := k.Table(f, table)
	if s == nil {
		return nil, nil
	}
	return s.Chains[chain], nil
}

func (k *fakeKernel) Elements(f plan.Family, keys []Key) ([]Element, error) {
	s, _ := k.Table(f, Table)
	if s == nil {
		return nil, nil
	}
	return elementsFor(keys, elementsOfState(s)), nil
}

var (
	chainHeaderRE = regexp.MustCompile(`^\s*chain (\S+) \{`)
	mapHeaderRE   = regexp.MustCompile(`^\s*(?:map|set) (\S+) \{`)
	elementRE     = regexp.MustCompile(`([0-9A-Za-z:.]+(?: \. [0-9A-Za-z:.]+)*) : goto ([A-Za-z0-9_.-]+)`)
	handleRE      = regexp.MustCompile(`# handle (\d+)\s*$`)
	commentRE     = regexp.MustCompile(`comment "([^"]*)"`)
	jumpRE        = regexp.MustCompile(`(?:jump|goto) (\S+)`)
	dnatRE        = regexp.MustCompile(`dnat (?:ip6? )?to (\S+)`)
	saddrRE       = regexp.MustCompile(`ip6? saddr (\S+)`)
	lookupRE      = regexp.MustCompile(`vmap @(\S+)`)
)

// withFlatSkeleton adds to the canned table the maps and sets of flat
// attachments whose hairpin sources have lengths, as a node has them
// after a flat ADD wrote them (the dispatch chain's rules are not read
// by the fast path).
func withFlatSkeleton(k *fakeKernel, lengths ...int) {
	t := k.tables["ip "+Table]
	i := strings.LastIndex(t, "}")
	var b strings.Builder
	for _, name := range flatSetNames(lengths) {
		b.WriteString("\tset " + name + " {\n\t}\n")
	}
	k.tables["ip "+Table] = t[:i] + b.String() + t[i:]
}

// parseListing reads nft -a list table output into what the netlink
// reader returns.
func parseListing(f plan.Family, out string) *State {
	s := newState()
	var chain *ChainState
	currentMap := ""
	for _, line := range strings.Split(out, "\n") {
		t := strings.TrimSpace(line)
		if m := chainHeaderRE.FindStringSubmatch(line); m != nil {
			chain = &ChainState{}
			s.Chains[m[1]] = chain
			continue
		}
		if m := mapHeaderRE.FindStringSubmatch(line); m != nil {
			currentMap = m[1]
			s.Maps[currentMap] = true
			chain = nil
			continue
		}
		if t == "}" {
			chain, currentMap = nil, ""
			continue
		}
		if currentMap != "" {
			for _, m := range elementRE.FindAllStringSubmatch(line, -1) {
				if k, ok := parseKey(m[1]); ok && k.Map() == currentMap {
					s.Holders[k.ID()] = m[2]
				}
			}
			continue
		}
		if chain == nil || t == "" || strings.HasPrefix(t, "type ") {
			continue
		}
		if m := commentRE.FindStringSubmatch(t); m != nil && strings.HasPrefix(t, "comment ") {
			chain.Comment = m[1]
			continue
		}
		r := RuleState{Masq: strings.Contains(t, "masquerade"), SetMark: strings.Contains(t, "meta mark set"),
			Drop: strings.HasSuffix(strings.TrimSpace(handleRE.ReplaceAllString(t, "")), " drop"), Fib: strings.Contains(t, "fib daddr")}
		if m := handleRE.FindStringSubmatch(t); m != nil {
			r.Handle, _ = strconv.ParseUint(m[1], 10, 64)
		}
		for _, x := range []struct {
			re *regexp.Regexp
			to *string
		}{{commentRE, &r.Comment}, {jumpRE, &r.Jump}, {dnatRE, &r.DNAT}, {lookupRE, &r.Lookup}} {
			if m := x.re.FindStringSubmatch(t); m != nil {
				*x.to = m[1]
			}
		}
		if m := saddrRE.FindStringSubmatch(t); m != nil {
			r.Saddr = parsePrefix(m[1]).String()
		}
		chain.Rules = append(chain.Rules, r)
	}
	return s
}

// Hairpins finds none: canned listings hold no hairpin set.
func (k *fakeKernel) Hairpins(plan.Family, []Hairpin) ([]Hairpin, error) { return nil, nil }

func (k *fakeKernel) Probe(f plan.Family, chains, sets []string, keys []Key) ([]string, []Element, error) {
	s, _ := k.Table(f, Table)
	var missing []string
	for _, c := range chains {
		if s == nil || s.Chains[c] == nil {
			missing = append(missing, c)
		}
	}
	for _, c := range sets {
		if s == nil || !s.Maps[c] {
			missing = append(missing, c)
		}
	}
	held, err := k.Elements(f, keys)
	return missing, held, err
}
