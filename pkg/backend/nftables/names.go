package nftables

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Names the kernel keeps (table, maps, sets, chains, comments): never
// change them without a migration. Our own table, not upstream's
// cni_hostport, so both can coexist during a migration.
const (
	Table          = "cni_portmap"
	hostPortsMap   = "hostports"
	hostIPPortsMap = "hostip_hostports"
	// the interval maps (ranges.go)
	hostPortRangesMap   = "hostport_ranges"
	hostIPPortRangesMap = "hostip_hostport_ranges"
	DispatchChain       = "dispatch"
	tableComment        = "CNI portmap: host ports to containers"
	// Rule comments; the "hostport" ones name the keys an attachment
	// claims, so DEL needs no state but its own chain.
	keyComment    = "hostport "
	hairpinRule   = "hairpin"
	localhostRule = "localhost"
)

const (
	HostDNATMap   = "hostport_dnat"
	hostIPDNATMap = "hostip_hostport_dnat"
	// hairpinPrefix starts the names of the hairpin sets, which end with
	// the prefix length: hairpin_24, hostip_hairpin_24.
	hairpinPrefix       = "hairpin_"
	hostIPHairpinPrefix = "hostip_hairpin_"
	// flatMarkBit is the bit the dispatch chain's hairpin rules set.
	flatMarkBit = 13
	// flatMax is the most mappings a flat plan has.
	flatMax = 16
	// ownersMap holds a goto to each flat attachment's chain.
	ownersMap = "owners"
	// claimComment starts a flat attachment's claim rules' comment,
	// the key following: "record tcp . 8080".
	claimComment = "record "
)

// upstreamTable is the upstream plugin's nftables table; DEL cleans it of
// the container's rules.
const upstreamTable = "cni_hostport"

// nftFamily is the family's name in nft: its tables' family.
func nftFamily(f plan.Family) string { return nft.Family(f).String() }

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}

// networkPrefix starts the chain name of every attachment of network, so
// GC can pick one network's chains by name.
func networkPrefix(network string) string { return "dn-" + shortHash(network) + "-" }

// ChainName is the attachment's own chain: hashes of the network and of
// ifname:containerID, as the plugins' ipmasq nftables code names its chains.
func ChainName(o plan.Owner) string {
	return networkPrefix(o.Network) + shortHash(o.IfName+":"+o.ContainerID)
}

// masqChain is the postrouting chain that masquerades connections marked
// with bit: one per mark bit in use, so attachments with different
// markMasqBit settings do not undo each other.
func masqChain(bit int) string { return fmt.Sprintf("masquerade-bit%d", bit) }

// GuardChain (IPv4, filter input hook) drops connections to 127.0.0.0/8
// that arrive from outside: route_localnet, which localhost host ports
// need, would otherwise let a container or a neighbour reach services the
// host binds to 127.0.0.1 (the CVE-2020-8558 class of bug).
const GuardChain = "guard"

// markChain sets the masquerade mark bit; attachments jump to it, which
// also makes their fast-path ADD fail (and the slow path write the
// skeleton) while the skeleton for that bit is missing.
func markChain(bit int) string { return fmt.Sprintf("mark-bit%d", bit) }

func isDNATMap(name string) bool { return name == HostDNATMap || name == hostIPDNATMap }

// hairpinSet names the hairpin set of a host IP kind and prefix length.
func hairpinSet(addr bool, ones int) string {
	if addr {
		return hostIPHairpinPrefix + strconv.Itoa(ones)
	}
	return hairpinPrefix + strconv.Itoa(ones)
}

// hairpinLength reads the prefix length out of a hairpin set's name.
func hairpinLength(name string) (addr bool, ones int, ok bool) {
	rest, addr := strings.CutPrefix(name, hostIPHairpinPrefix)
	if !addr {
		if rest, ok = strings.CutPrefix(name, hairpinPrefix); !ok {
			return false, 0, false
		}
	}
	n, err := strconv.Atoi(rest)
	return addr, n, err == nil && n >= 0 && n <= 128 && strconv.Itoa(n) == rest
}
