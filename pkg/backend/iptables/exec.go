package iptables

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	goiptables "github.com/coreos/go-iptables/iptables"

	"github.com/portmap-dev/portmap/pkg/child"
	"github.com/portmap-dev/portmap/pkg/lock"
	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// execKernel runs the real tools: iptables-restore for writes, go-iptables
// for the slow path's checks and listings.
type execKernel struct {
	family  plan.Family
	table   string // the table ListTable lists
	nl      *nfnl.Conn
	restore string
	list    string
	proto   goiptables.Protocol
	ipt     *goiptables.IPTables // made on first use: it runs iptables --version
}

// RestoreCommand is the restore tool of family f.
func RestoreCommand(f plan.Family) string {
	if f == plan.IPv6 {
		return "ip6tables-restore"
	}
	return "iptables-restore"
}

func newExecKernel(f plan.Family, table string) (*execKernel, error) {
	path, err := exec.LookPath(RestoreCommand(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f, err)
	}
	proto, list := goiptables.ProtocolIPv4, "iptables"
	if f == plan.IPv6 {
		proto, list = goiptables.ProtocolIPv6, "ip6tables"
	}
	return &execKernel{family: f, table: table, restore: path, list: list, proto: proto}, nil
}

func (k *execKernel) Unlink(parent, chain string) (bool, error) {
	if k.table != Table || xt.LegacyTable(k.family, k.table) {
		return false, xt.ErrLegacy
	}
	c, err := k.netlink()
	if err != nil {
		return false, err
	}
	found, _, err := xt.UnlinkOn(c, k.family, parent, chain)
	return found, err
}

// AddChain writes into nf_tables whatever the restore tool is called:
// ADD takes its fast path only where it read the shared rules there
// (skeletonStands), so the node's iptables keeps its nat table in
// nf_tables — unless an iptables-legacy table of that name exists.
func (k *execKernel) AddChain(marker, chain string, rules, entries []xt.Rule, jumps ...string) error {
	if k.table != Table || xt.LegacyTable(k.family, k.table) {
		return xt.ErrLegacy
	}
	msgs, err := xt.AddChainMsgs(k.family, marker, chain, rules, entries, jumps...)
	if err != nil {
		return err
	}
	c, err := k.netlink()
	if err != nil {
		return err
	}
	if err := c.Batch(msgs, true); err != nil {
		return fmt.Errorf("add chain %s over nf_tables: %w", chain, err)
	}
	return nil
}

func (k *execKernel) Chains(table string, names []string, rules bool) (map[string]xt.ChainSummary, error) {
	if xt.LegacyTable(k.family, table) {
		return nil, xt.ErrLegacy
	}
	c, err := k.netlink()
	if err != nil {
		return nil, err
	}
	return xt.Summarize(c, k.family, table, names, rules)
}

// netlink is the kernel's nf_tables socket, opened once.
func (k *execKernel) netlink() (*nfnl.Conn, error) {
	if k.nl == nil {
		c, err := nfnl.Open()
		if err != nil {
			return nil, err
		}
		k.nl = c
	}
	return k.nl, nil
}

func (k *execKernel) Restore(payload []byte) error { return k.run(payload) }

func (k *execKernel) Test(payload []byte) error { return k.run(payload, "--test") }

// Writable sends the write probe when the restore tool is iptables-nft's
// and the table is not iptables-legacy's: what the tool writes goes to
// nf_tables, from a child with this process's credentials, so nf_tables
// takes it when it takes the probe.
func (k *execKernel) Writable() error {
	if xt.LegacyTable(k.family, k.table) || !nftTool(k.restore) {
		return nfnl.ErrNoProbe
	}
	c, err := k.netlink()
	if err != nil {
		return err
	}
	return c.Writable(nft.Family(k.family).Proto())
}

// nftTool reports whether the restore tool at path is iptables-nft's, by
// what it resolves to: the multi-call binary xtables-nft-multi, or a tool
// named (ip6)iptables-nft-restore. A wrapper that picks its mode when it
// runs, or any other name, is not known to be.
func nftTool(path string) bool {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false
	}
	base := filepath.Base(real)
	return base == "xtables-nft-multi" || strings.HasSuffix(base, "tables-nft-restore")
}

func (k *execKernel) run(payload []byte, extra ...string) error {
	cmd := child.Command(k.restore, append([]string{"--noflush", "-w", "20"}, extra...)...)
	cmd.Stdin = bytes.NewReader(payload)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		refused := errors.As(err, &ee) && (ee.ExitCode() == 1 || ee.ExitCode() == 2)
		re := &xt.RestoreError{Output: out.String(), Err: fmt.Errorf("%s: %w", k.restore, err), Refused: refused}
		if held := xtablesHolder(re.Output); held != "" {
			re.Output = strings.TrimSpace(re.Output) + held
			re.Err = fmt.Errorf("%s: %w (%w)", k.restore, err, lock.ErrTimeout)
		}
		return re
	}
	return nil
}

// listError is a listing's failure with what the tool printed; one that
// gave up waiting for the xtables lock names its holder and is a
// lock.ErrTimeout.
func listError(cmd string, err error, stderr string) error {
	if held := xtablesHolder(stderr); held != "" {
		return fmt.Errorf("%s: %w: %s%s (%w)", cmd, err, strings.TrimSpace(stderr), held, lock.ErrTimeout)
	}
	return fmt.Errorf("%s: %w: %s", cmd, err, strings.TrimSpace(stderr))
}

// xtablesHolder names who holds the xtables lock when a tool's output
// says it gave up waiting for it (iptables-legacy: "Another app is
// currently holding the xtables lock"): " (the xtables lock
// /run/xtables.lock, held by pid 1234 (iptables-restor))", or "".
// XTABLES_LOCKFILE moves the lock (iptables 1.8.7 and later), for the
// tools as for this.
func xtablesHolder(output string) string {
	if !strings.Contains(output, "xtables lock") {
		return ""
	}
	path := os.Getenv("XTABLES_LOCKFILE")
	if path == "" {
		path = "/run/xtables.lock"
	}
	return fmt.Sprintf(" (the xtables lock %s%s)", path, lock.HeldBy(path))
}

func (k *execKernel) handle() (*goiptables.IPTables, error) {
	if k.ipt == nil {
		ipt, err := goiptables.New(goiptables.IPFamily(k.proto), goiptables.Timeout(20))
		if err != nil {
			return nil, err
		}
		k.ipt = ipt
	}
	return k.ipt, nil
}

func (k *execKernel) ListTable() ([]string, error) {
	// Listing one chain would be less text, but iptables-nft answers
	// "incompatible" instead of "no such chain" when the table is missing.
	cmd := child.Command(k.list, "-w", "20", "-t", k.table, "-S")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, listError(fmt.Sprintf("%s -t %s -S", k.list, k.table), err, stderr.String())
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n"), nil
}

func (k *execKernel) ListChain(chain string) ([]string, error) {
	cmd := child.Command(k.list, "-w", "20", "-t", k.table, "-S", chain)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, listError(fmt.Sprintf("%s -t %s -S %s", k.list, k.table, chain), err, stderr.String())
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n"), nil
}

func (k *execKernel) EnsureChain(c xt.Chain) error {
	ipt, err := k.handle()
	if err != nil {
		return err
	}
	exists, err := ipt.ChainExists(c.Table, c.Name)
	if err != nil || exists {
		return err
	}
	err = ipt.NewChain(c.Table, c.Name)
	var ie *goiptables.Error
	if errors.As(err, &ie) && ie.ExitStatus() == 1 {
		// Created meanwhile by a process outside our lock (the upstream
		// plugin): fine if it exists now.
		if ok, _ := ipt.ChainExists(c.Table, c.Name); ok {
			return nil
		}
	}
	return err
}

func (k *execKernel) EnsureRule(r xt.Rule) error {
	ipt, err := k.handle()
	if err != nil {
		return err
	}
	t := r.TableName()
	exists, err := ipt.Exists(t, r.Chain, r.Args()...)
	if err != nil || exists {
		return err
	}
	if r.Insert {
		return ipt.Insert(t, r.Chain, 1, r.Args()...)
	}
	return ipt.Append(t, r.Chain, r.Args()...)
}
