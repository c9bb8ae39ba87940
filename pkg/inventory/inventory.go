// Package inventory reads the host-port table of this host back from the
// kernel state both backends keep — ours, and the upstream plugin's
// iptables layout, which has the same names — for `portmap list` and for
// the "reject" host-port conflict policy. The parsers are pure and tested
// on captured listings.
package inventory

import (
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Entry is one forwarded host port.
type Entry struct {
	HostIP        string `json:"hostIP"` // "*" for every address
	HostPort      int    `json:"hostPort"`
	Protocol      string `json:"protocol"`
	ContainerIP   string `json:"containerIP"`
	ContainerPort int    `json:"containerPort"`
	Network       string `json:"network"`
	ContainerID   string `json:"containerID"`
	Backend       string `json:"backend"`
}

// Overlaps reports whether e and the mapping (hostIP, port, proto) would
// catch the same packets: same protocol and port, and host IPs that are
// equal or of which one is "*".
func (e Entry) Overlaps(hostIP string, port int, proto string) bool {
	return e.HostPort == port && e.Protocol == proto &&
		(e.HostIP == "*" || hostIP == "*" || e.HostIP == hostIP)
}

var (
	ownerRE  = regexp.MustCompile(`--comment "dnat name: \\"([^"\\]*)\\" id: \\"([^"\\]*)\\"".* -j (CNI-DN-\S+)$`)
	chainArg = regexp.MustCompile(`^-A (CNI-DN-\S+) `)
)

// ParseIPTables reads `iptables -t nat -S` (or ip6tables) lines: the owner
// of each CNI-DN chain from its entry rule's comment, the mappings from
// its DNAT rules.
func ParseIPTables(lines []string) []Entry {
	owners := map[string][2]string{}
	for _, l := range lines {
		if m := ownerRE.FindStringSubmatch(l); m != nil && strings.HasPrefix(l, "-A CNI-HOSTPORT-DNAT ") {
			owners[m[3]] = [2]string{m[1], m[2]}
		}
	}
	var out []Entry
	for _, l := range lines {
		m := chainArg.FindStringSubmatch(l)
		if m == nil || !strings.Contains(l, " -j DNAT ") {
			continue
		}
		f := strings.Fields(l)
		e := Entry{HostIP: "*", Backend: "iptables"}
		for i := 0; i+1 < len(f); i++ {
			switch f[i] {
			case "-d":
				e.HostIP = strings.TrimSuffix(strings.TrimSuffix(f[i+1], "/32"), "/128")
			case "-p":
				e.Protocol = f[i+1]
			case "--dport":
				e.HostPort, _ = strconv.Atoi(f[i+1])
			case "--to-destination":
				e.ContainerIP, e.ContainerPort = splitHostPort(f[i+1])
			}
		}
		if o, ok := owners[m[1]]; ok {
			e.Network, e.ContainerID = o[0], o[1]
		} else {
			e.Network, e.ContainerID = "?", "?"
		}
		out = append(out, e)
	}
	return out
}

func splitHostPort(s string) (string, int) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return s, 0
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

var (
	nftChainRE   = regexp.MustCompile(`^\s*chain (dn-\S+) \{`)
	nftCommentRE = regexp.MustCompile(`^\s*comment "net=(\S*) id=(\S*)(?: if=(\S*))?"`)
	nftDNATRE    = regexp.MustCompile(`dnat (?:ip6? )?to (\S+) comment "hostport ([^"]+)"`)
)

// ParseNFTables reads `nft list table <family> cni_portmap`: each dn-
// chain's owner from its comment, the mappings from its DNAT rules and
// their "hostport <key>" comments.
func ParseNFTables(out string) []Entry {
	var entries []Entry
	var cur []Entry
	network, id := "?", "?"
	flush := func() {
		for i := range cur {
			cur[i].Network, cur[i].ContainerID = network, id
		}
		entries = append(entries, cur...)
		cur, network, id = nil, "?", "?"
	}
	for _, l := range strings.Split(out, "\n") {
		if nftChainRE.MatchString(l) {
			flush()
			continue
		}
		if m := nftCommentRE.FindStringSubmatch(l); m != nil {
			network, id = m[1], m[2]
			continue
		}
		m := nftDNATRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		e := Entry{HostIP: "*", Backend: "nftables"}
		e.ContainerIP, e.ContainerPort = splitHostPort(m[1])
		key := strings.Split(m[2], " . ")
		if len(key) == 3 {
			e.HostIP, key = key[0], key[1:]
		}
		if len(key) == 2 {
			e.Protocol = key[0]
			e.HostPort, _ = strconv.Atoi(key[1])
		}
		cur = append(cur, e)
	}
	flush()
	return entries
}

// Sort orders entries by host port, protocol, host IP and owner.
func Sort(es []Entry) {
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if a.HostPort != b.HostPort {
			return a.HostPort < b.HostPort
		}
		if a.Protocol != b.Protocol {
			return a.Protocol < b.Protocol
		}
		if a.HostIP != b.HostIP {
			return a.HostIP < b.HostIP
		}
		return a.Network+a.ContainerID < b.Network+b.ContainerID
	})
}
