package nftables

import (
	"net/netip"
	"regexp"
	"strings"
	"sync"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// State is what a read of one table tells: its chains with their rules,
// which maps exist, and for each map key the chain its verdict names.
// Reads of part of a table (one chain, some keys) fill only that part.
type State struct {
	Chains map[string]*ChainState
	Maps   map[string]bool
	// Elements are the dispatch and DNAT maps' elements by key,
	// Hairpins the hairpin sets' elements (flat.go).
	Elements map[Key]Element
	Hairpins []Hairpin
	// Missing are the chains and sets a Query probed that are absent.
	Missing []string
}

// Query names what one Kernel.Read fetches.
type Query struct {
	// Chains are read with their rules; one that is absent is not in
	// the State's Chains.
	Chains []string
	// Probe (chains) and Sets (sets and maps) are asked only whether
	// they are there.
	Probe, Sets []string
	// Keys are elements asked for: a key of one port, its element; an
	// interval key, the intervals of its class and the elements of one
	// port among and beside its ports (what ADD takes over, and whether
	// what it leaves of another interval is held).
	Keys []Key
	// Hairpins are hairpin elements asked for, read with their owners.
	Hairpins []Hairpin
}

// newState is an empty State.
func newState() *State {
	return &State{Chains: map[string]*ChainState{}, Maps: map[string]bool{}, Elements: map[Key]Element{}}
}

// ChainState is one chain: its comment and rules and, for a flat
// attachment (flat.go), its claims: the keys its claim rules name (not
// among Rules); Owned says the owners map holds the chain.
type ChainState struct {
	Comment   string
	Rules     []RuleState
	HasClaims bool
	Claims    []Key
	Owned     bool
}

// RuleState is a rule as read and, for a dnatMap rule, what its map
// holds.
type RuleState struct {
	*nft.Rule
	DNATs []MapDNAT
}

// MapDNAT is one element of a DNAT rule's map: a key and its target.
type MapDNAT struct {
	Key Key
	To  netip.AddrPort
}

// keys are the keys the chain claims: those its "hostport" rule comments
// name, and those of its DNAT maps.
func (c *ChainState) keys() []Key {
	var out []Key
	for _, r := range c.Rules {
		if s, ok := strings.CutPrefix(r.Comment, keyComment); ok {
			if k, ok := parseKey(s); ok {
				out = append(out, k)
			}
		}
		for _, d := range r.DNATs {
			out = append(out, d.Key)
		}
	}
	out = append(out, c.Claims...)
	return out
}

var ownerRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^net=(\S*) id=(\S*)`) })

// owner reads the chain's comment (ownerComment).
func (c *ChainState) owner() (network, id string, ok bool) {
	m := ownerRE().FindStringSubmatch(c.Comment)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// Kernel reads and writes nf_tables.
type Kernel interface {
	// Apply commits tx as one transaction: all of it or nothing.
	Apply(tx *nft.Tx) error
	// Validate has the kernel check tx without committing it.
	Validate(tx *nft.Tx) error
	// Writable reports whether nf_tables takes changes of family f from
	// us, changing nothing and aborting no batch (nfnl.Conn.Writable);
	// nfnl.ErrNoProbe where it cannot tell that way.
	Writable(f plan.Family) error
	// Read fetches what q names of the family's cni_portmap table in
	// one round trip of gets, then a dump of each chain found for its
	// rules and, for an interval key or more than holdersByDump keys, of
	// their maps.
	Read(f plan.Family, q Query) (*State, error)
	// Table reads the family's table whole; nil when it is absent.
	Table(f plan.Family, table string) (*State, error)
}

// Element is one element of a dispatch map: its key (an interval key in
// the ranges maps) and the chain its verdict names; for a flat key (a
// DNAT map's), the chain its comment names and its target.
type Element struct {
	Key   Key
	Chain string
	To    netip.AddrPort
	// Srcs are the sources a flat element's comment names after its
	// chain: its owner's hairpin sources, whose elements it holds.
	Srcs []string
}

// String is e as tests and logs show it: {key chain}, a flat one's with
// its target and sources.
func (e Element) String() string {
	if !e.Key.Flat {
		return "{" + e.Key.String() + " " + e.Chain + "}"
	}
	return "{" + e.Key.String() + " " + e.Chain + " " + e.To.String() + " " + strings.Join(e.Srcs, ",") + "}"
}
