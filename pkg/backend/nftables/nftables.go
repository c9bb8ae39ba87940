// Package nftables is the nftables backend: one table per family, one
// transaction per verb, and one map lookup per new connection whatever the
// number of containers.
//
//	table ip cni_portmap {
//	  map hostports        { type inet_proto . inet_service : verdict }              wildcard host IP
//	  map hostip_hostports { type ipv4_addr . inet_proto . inet_service : verdict }  one host IP
//	  chain prerouting { type nat hook prerouting priority dstnat; fib daddr type local jump dispatch }
//	  chain output     { type nat hook output priority dstnat;     fib daddr type local jump dispatch }
//	  chain dispatch   { ip daddr . meta l4proto . th dport vmap @hostip_hostports
//	                     meta l4proto . th dport vmap @hostports }
//	  chain dn-<hash(net)>-<hash(if:cid)> {                         one per attachment
//	    [conditions] meta l4proto tcp th dport 8080 ip saddr <subnet> jump mark-bit13     (hairpin)
//	    [conditions] meta l4proto tcp th dport 8080 ip saddr 127.0.0.1 jump mark-bit13    (localhost)
//	    [conditions] meta l4proto tcp th dport 8080 dnat to 192.0.2.2:80 comment "hostport tcp . 8080" }
//	  chain mark-bit13 { meta mark set meta mark | 0x2000 }
//	  chain masquerade-bit13 { type nat hook postrouting priority srcnat; meta mark & 0x2000 == 0x2000 masquerade }
//	}
//
// A map element's verdict (goto dn-...) names its owner. ADD's fast path is
// one transaction that creates the attachment's chain (failing if it
// exists) and adds its elements (failing if another attachment holds a
// key). DEL's fast path is one transaction that, for each key, adds the
// element with its own verdict and deletes it — which fails if another
// attachment took the key over, so DEL never removes another's mapping —
// then deletes its chain (which the kernel refuses while any element still
// points at it). Only when a fast path fails does the slow path run under
// the host-wide lock, reading the attachment's own chain (its "hostport"
// rule comments record the keys it claims) and, for ADD, the maps.
package nftables

import (
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Kernel runs nft scripts.
type Kernel interface {
	// Run feeds script to nft -f - and returns what it printed.
	Run(script string) (string, error)
	// Check runs script with nft --check: validated, not committed.
	Check(script string) error
}

// Backend applies plans of one family.
type Backend struct {
	Family plan.Family
	Kernel Kernel
	Lock   func() (release func(), err error)
	// Log receives notes such as port takeovers.
	Log io.Writer
}

// LockTimeout bounds the wait for the host-wide lock.
const LockTimeout = 30 * time.Second

// New returns the backend of family f on the real kernel; it fails when
// nft is not on PATH. It runs no process: knftables.New would run two
// (nft --version and nft --check) on every invocation.
func New(f plan.Family, log io.Writer) (*Backend, error) {
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f, err)
	}
	return &Backend{
		Family: f,
		Kernel: execKernel{path: path},
		Lock:   func() (func(), error) { return lock.Acquire(lock.DefaultPath, LockTimeout) },
		Log:    log,
	}, nil
}

// Error is a failed nft run with what it printed.
type Error struct {
	Output string
	Err    error
}

func (e *Error) Error() string { return fmt.Sprintf("%v: %s", e.Err, strings.TrimSpace(e.Output)) }
func (e *Error) Unwrap() error { return e.Err }

type execKernel struct{ path string }

func (k execKernel) Run(script string) (string, error) { return k.run(script, "-a") }

func (k execKernel) Check(script string) error {
	_, err := k.run(script, "--check")
	return err
}

func (k execKernel) run(script string, flag string) (string, error) {
	// -a: listings carry rule handles (removeUpstream deletes by handle).
	cmd := exec.Command(k.path, flag, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), &Error{Output: stderr.String(), Err: fmt.Errorf("nft: %w", err)}
	}
	return out.String(), nil
}

func (b *Backend) run(tx *knftables.Transaction) error {
	_, err := b.Kernel.Run(tx.String())
	return err
}

// Apply installs the plan, replacing whatever the attachment had; a key
// another attachment holds is taken over (the newest ADD wins).
func (b *Backend) Apply(p *plan.Plan) error {
	if p.ContainerNet == nil {
		return fmt.Errorf("%s: no container address to forward to", b.Family)
	}
	// Fast path: the skeleton is left alone (rewriting the base chains
	// costs the kernel more than everything else); the elements fail while
	// the maps are missing, and the jumps to mark-bitN while that bit's
	// skeleton is, which sends the first ADD on a node to the slow path.
	if err := b.run(fastAddTx(p)); err == nil {
		return nil
	}

	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	chain := ownChain(p)
	prev, _, err := b.ownKeys(p)
	if err != nil {
		return err
	}
	holders, err := b.holders()
	if err != nil {
		return err
	}
	tx := newTx(b.Family)
	addSkeleton(tx, p)
	tx.Add(chain)
	tx.Flush(chain)
	for _, r := range chainRules(p) {
		tx.Add(r)
	}
	want := map[string]bool{}
	for _, k := range Keys(p) {
		want[k.Map()+" "+k.String()] = true
	}
	for _, k := range prev {
		if !want[k.Map()+" "+k.String()] && holders[k.Map()+" "+k.String()] == chain.Name {
			tx.Delete(&knftables.Element{Map: k.Map(), Key: k.Fields()})
		}
	}
	for _, k := range Keys(p) {
		el := &knftables.Element{Map: k.Map(), Key: k.Fields(), Value: verdict(p.Owner)}
		if h := holders[k.Map()+" "+k.String()]; h != "" && h != chain.Name {
			fmt.Fprintf(b.Log, "portmap: %s %s was forwarded by chain %s; %s takes it over\n", b.Family, k, h, chain.Name)
			tx.Delete(el)
		}
		tx.Add(el)
	}
	if err := b.run(tx); err != nil {
		return fmt.Errorf("%s: apply: %w", b.Family, err)
	}
	return nil
}

// Remove deletes the attachment's chain and the map elements that still
// point at it; it is idempotent and never removes another attachment's
// element.
func (b *Backend) Remove(p *plan.Plan) error {
	chain := ChainName(p.Owner)
	if len(p.Mappings) > 0 {
		if err := b.run(fastDelTx(p)); err == nil {
			return nil
		}
	}

	release, err := b.Lock()
	if err != nil {
		return err
	}
	defer release()
	if err := b.removeUpstream(p.Owner); err != nil {
		return err
	}
	keys, exists, err := b.ownKeys(p)
	if err != nil || !exists {
		return err
	}
	// One transaction per key: a key another attachment took over fails
	// alone and stays with its new owner.
	for _, k := range append(Keys(p), keys...) {
		tx := newTx(b.Family)
		releaseKey(tx, k, p.Owner)
		_ = b.run(tx)
	}
	tx := newTx(b.Family)
	tx.Flush(&knftables.Chain{Name: chain})
	tx.Delete(&knftables.Chain{Name: chain})
	if err := b.run(tx); err != nil {
		return fmt.Errorf("%s: remove chain %s: %w", b.Family, chain, err)
	}
	return nil
}

// fastDelTx is DEL's fast path: release each of the plan's keys while it
// still points at the attachment's chain, then delete the chain (which
// the kernel refuses while any element still points at it).
func fastDelTx(p *plan.Plan) *knftables.Transaction {
	tx := newTx(p.Family)
	for _, k := range Keys(p) {
		releaseKey(tx, k, p.Owner)
	}
	chain := ChainName(p.Owner)
	tx.Flush(&knftables.Chain{Name: chain})
	tx.Delete(&knftables.Chain{Name: chain})
	return tx
}

// releaseKey deletes k's element if it points at owner's chain or is
// absent; the transaction fails when another attachment holds k.
func releaseKey(tx *knftables.Transaction, k Key, o plan.Owner) {
	tx.Add(&knftables.Element{Map: k.Map(), Key: k.Fields(), Value: verdict(o)})
	tx.Delete(&knftables.Element{Map: k.Map(), Key: k.Fields()})
}

// ownKeys lists the attachment's chain (and only it) and returns the keys
// its "hostport" rules claim.
func (b *Backend) ownKeys(p *plan.Plan) (keys []Key, exists bool, err error) {
	out, err := b.Kernel.Run(fmt.Sprintf("list chain %s %s %s\n", nftFamily(b.Family), Table, ChainName(p.Owner)))
	if IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("%s: list chain: %w", b.Family, err)
	}
	for _, m := range keyCommentRE.FindAllStringSubmatch(out, -1) {
		if k, ok := parseKey(m[1]); ok {
			keys = append(keys, k)
		}
	}
	return keys, true, nil
}

var keyCommentRE = regexp.MustCompile(`comment "` + keyComment + `([^"]+)"`)

// holders reads both maps (slow path of ADD only) and returns, per
// "map key", the chain its verdict names.
func (b *Backend) holders() (map[string]string, error) {
	// Two "list map" commands in one script fail in nft 1.0.6; "list maps"
	// lists the family's maps of every table, parseMaps keeps ours.
	out, err := b.Kernel.Run(fmt.Sprintf("list maps %s\n", nftFamily(b.Family)))
	if err != nil {
		return nil, fmt.Errorf("%s: list maps: %w", b.Family, err)
	}
	return parseMaps(out), nil
}

var (
	tableHeaderRE = regexp.MustCompile(`^table \S+ (\S+) \{`)
	mapHeaderRE   = regexp.MustCompile(`map (\S+) \{`)
	elementRE     = regexp.MustCompile(`([0-9A-Za-z:.]+(?: \. [0-9A-Za-z:.]+)*) : goto ([A-Za-z0-9_.-]+)`)
)

// parseMaps reads the maps of our table from nft list output.
func parseMaps(out string) map[string]string {
	holders := map[string]string{}
	current, ours := "", true
	for _, line := range strings.Split(out, "\n") {
		if m := tableHeaderRE.FindStringSubmatch(line); m != nil {
			ours = m[1] == Table
			continue
		}
		if !ours {
			continue
		}
		if m := mapHeaderRE.FindStringSubmatch(line); m != nil {
			current = m[1]
			continue
		}
		for _, m := range elementRE.FindAllStringSubmatch(line, -1) {
			holders[current+" "+m[1]] = m[2]
		}
	}
	return holders
}

// removeUpstream deletes the rules the upstream plugin's nftables backend
// made for the container in its cni_hostport table (commented with the
// container ID), so that a node can move from it to us.
func (b *Backend) removeUpstream(o plan.Owner) error {
	fam := nftFamily(b.Family)
	out, err := b.Kernel.Run(fmt.Sprintf("list table %s %s\n", fam, UpstreamTable))
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: list %s: %w", b.Family, UpstreamTable, err)
	}
	var script strings.Builder
	chain := ""
	for _, line := range strings.Split(out, "\n") {
		if m := chainHeaderRE.FindStringSubmatch(line); m != nil {
			chain = m[1]
			continue
		}
		m := handleRE.FindStringSubmatch(line)
		if m != nil && m[1] == o.ContainerID {
			fmt.Fprintf(&script, "delete rule %s %s %s handle %s\n", fam, UpstreamTable, chain, m[2])
		}
	}
	if script.Len() == 0 {
		return nil
	}
	if _, err := b.Kernel.Run(script.String()); err != nil {
		return fmt.Errorf("%s: remove upstream rules of %q: %w", b.Family, o.ContainerID, err)
	}
	return nil
}

var (
	chainHeaderRE = regexp.MustCompile(`^\s*chain (\S+) \{`)
	handleRE      = regexp.MustCompile(`comment "([^"]*)" # handle (\d+)\s*$`)
)
