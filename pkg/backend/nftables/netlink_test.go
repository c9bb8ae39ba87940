package nftables

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// TestSkeletonReadsBack encodes the skeleton and decodes its rules: each
// shared rule is recognised by what CHECK and sync judge it by.
func TestSkeletonReadsBack(t *testing.T) {
	for _, p := range []*plan.Plan{build(plan.IPv4, nil), build(plan.IPv6, nil)} {
		tx := newTx(p.Family)
		addSkeletonOf(tx, p)
		msgs, err := tx.Messages()
		if err != nil {
			t.Fatal(err)
		}
		chains := map[string]*ChainState{}
		sets := map[string]uint16{}
		for _, m := range msgs {
			attrs := nfnl.Parse(m.Attrs)
			switch m.Type {
			case nfnl.NftType(unix.NFT_MSG_NEWRULE):
				name := attrs.String(unix.NFTA_RULE_CHAIN)
				if chains[name] == nil {
					chains[name] = &ChainState{}
				}
				chains[name].Rules = append(chains[name].Rules, decodeRule(p.Family, nfnl.Parse(m.Attrs)))
			case nfnl.NftType(unix.NFT_MSG_NEWSET):
				sets[attrs.String(unix.NFTA_SET_NAME)] = m.Flags
			}
		}
		skel := skeletonRules(layoutOf(p).needs, layoutOf(p).lengths)
		for _, name := range skeletonOrder(skel) {
			for _, r := range skel[name] {
				if chains[name] == nil || !hasRule(p.Family, chains[name], r) {
					t.Errorf("%s: chain %s: %q does not read back", p.Family, name, r.StmtText(nft.Family(p.Family)))
				}
			}
		}
		// The guard's { established, related } is an anonymous set made
		// in the same batch; the maps are added, never replaced.
		if p.Family == plan.IPv4 && sets["__set%d"] == 0 {
			t.Errorf("%s: no anonymous set for the guard: %v", p.Family, sets)
		}
		if sets[hostPortsMap]&unix.NLM_F_EXCL != 0 || sets[hostPortsMap]&unix.NLM_F_CREATE == 0 {
			t.Errorf("%s: map flags %#x, want create without excl", p.Family, sets[hostPortsMap])
		}
	}
}

func TestKeyBytes(t *testing.T) {
	for _, k := range layoutOf(build(plan.IPv4, nil)).keys {
		back, ok := keyFromBytes(plan.IPv4, k.Map(), k.bytes())
		if !ok || back != k {
			t.Errorf("keyFromBytes(%v) = %v, %v", k, back, ok)
		}
	}
	for _, bad := range []struct {
		set string
		b   []byte
	}{{hostPortsMap, []byte{6, 0}}, {hostIPPortsMap, []byte{1, 2}}, {"other", make([]byte, 8)}, {hostPortsMap, []byte{1, 0, 0, 0, 0, 80, 0, 0}}} {
		if k, ok := keyFromBytes(plan.IPv4, bad.set, bad.b); ok {
			t.Errorf("keyFromBytes(%s, %x) accepted: %v", bad.set, bad.b, k)
		}
	}
}

// TestBatchErrorNamesTheOperation: a failed batch message is reported as
// the nft command of its operation, counting the anonymous set messages
// a guard rule brings.
func TestBatchErrorNamesTheOperation(t *testing.T) {
	p := build(plan.IPv4, nil)
	tx := newTx(p.Family)
	addSkeletonOf(tx, p)
	tx.Create(ownChain(p))
	msgs, err := tx.Messages()
	if err != nil {
		t.Fatal(err)
	}
	last := len(msgs) - 1
	err = &nft.Error{Op: tx.Describe(&nfnl.Error{Index: last, Errno: unix.EEXIST}), Err: unix.EEXIST}
	if !strings.Contains(err.Error(), "create chain ip cni_portmap "+ChainName(p.Owner)) || !errors.Is(err, unix.EEXIST) {
		t.Errorf("error %q does not name the chain creation", err)
	}
	if d := tx.Describe(errors.New("other")); !strings.Contains(d, "transaction of") {
		t.Errorf("describe of a non-netlink error: %q", d)
	}
}
