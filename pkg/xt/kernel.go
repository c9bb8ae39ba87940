package xt

// Kernel is the seam between an iptables backend and x_tables: the
// restore tool, its listings and, on iptables-nft, nf_tables netlink.
type Kernel interface {
	// Restore feeds payload to (ip6)iptables-restore --noflush.
	Restore(payload []byte) error
	// Test feeds payload to (ip6)iptables-restore --test: parsed and
	// checked by the kernel, not committed.
	Test(payload []byte) error
	// Writable reports, without a process and without a batch the kernel
	// aborts, whether the restore tool's changes would be taken
	// (nfnl.Conn.Writable); nfnl.ErrNoProbe where it cannot tell that
	// way: iptables-legacy, a tool not known to be iptables-nft's, a
	// kernel before Linux 6.3.
	Writable() error
	// ListTable returns the kernel's table (nat for the backend, filter
	// for Forward) as iptables -S prints it: "-N chain" and "-A chain
	// rule" lines.
	ListTable() ([]string, error)
	// ListChain is ListTable for one chain that exists (iptables -S
	// CHAIN: iptables-nft fetches that chain alone).
	ListChain(chain string) ([]string, error)
	// EnsureChain creates the chain if it is missing.
	EnsureChain(c Chain) error
	// EnsureRule adds r if no identical rule exists.
	EnsureRule(r Rule) error
	// Unlink removes chain and the rules of parent that jump to it in one
	// transaction, over nf_tables netlink: no process, no rule cache.
	// found is false when the chain does not exist. It fails with
	// ErrLegacy when this namespace has an iptables-legacy table.
	Unlink(parent, chain string) (found bool, err error)
	// AddChain is ADD's fast path in one nf_tables transaction, no
	// process: it flushes marker (failing unless it exists; "" for
	// none), creates chain (failing if it exists), appends rules and
	// inserts entries at the top of their chain; they may jump to chain
	// and to jumps. It fails with ErrLegacy where only the tools reach
	// the table (iptables-legacy), with ErrNotNative for a rule it does
	// not write, and with the kernel's EEXIST or ENOENT when the node is
	// not in the state the fast path assumes.
	AddChain(marker, chain string, rules, entries []Rule, jumps ...string) error
	// Chains reads chains of table over nf_tables netlink — no process,
	// no rule cache of the table: each of names that exists, with its
	// rules' count and the chains they jump to when rules is set (a dump
	// of the chain's rules; without, a zero summary says it exists). It
	// fails with ErrLegacy when this namespace has an iptables-legacy
	// table of that name.
	Chains(table string, names []string, rules bool) (map[string]ChainSummary, error)
}

// ChainSummary is what Kernel.Chains tells of one chain.
type ChainSummary struct {
	Rules int
	Jumps []string
	// Refs counts the rules, of any chain, that jump to it (with rules
	// set; nf_tables: the chain's use count less its own rules).
	Refs int
	// Exprs are its rules' expressions as the kernel dumps them
	// (NFTA_RULE_EXPRESSIONS), with rules set: what a CHECK compares
	// with the rules the native writer writes.
	Exprs [][]byte
}
