package nftables

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// IsNotFound reports whether err is nft's answer for an object (a table,
// a chain) that does not exist.
func IsNotFound(err error) bool {
	var ne *Error
	return errors.As(err, &ne) && strings.Contains(ne.Output, "No such file or directory")
}

// Forwards reads back the host ports this family's cni_portmap table
// forwards, in one listing; a missing table forwards nothing.
func (b *Backend) Forwards() ([]plan.Forward, error) {
	out, err := b.Kernel.Run(fmt.Sprintf("list table %s %s\n", nftFamily(b.Family), Table))
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: list table: %w", b.Family, err)
	}
	return ParseForwards(out), nil
}

// dnatRE reads an attachment's DNAT rule as nft prints it: the target and
// the key its comment claims (keyComment).
var dnatRE = regexp.MustCompile(`dnat (?:ip6? )?to (\S+) comment "` + keyComment + `([^"]+)"`)

// ParseForwards reads `nft list table <family> cni_portmap`: each dn-
// chain's owner from its comment (OwnerComment), the mappings from its
// DNAT rules and their "hostport <key>" comments.
func ParseForwards(out string) []plan.Forward {
	var fs []plan.Forward
	for name, text := range splitChains(out) {
		if !strings.HasPrefix(name, "dn-") {
			continue
		}
		owner := plan.Owner{Network: plan.Unknown, ContainerID: plan.Unknown}
		if m := ownerCommentRE.FindStringSubmatch(text); m != nil {
			owner = plan.Owner{Network: m[1], ContainerID: m[2]}
		}
		for _, m := range dnatRE.FindAllStringSubmatch(text, -1) {
			k, ok := parseKey(m[2])
			if !ok {
				continue
			}
			f := plan.Forward{HostIP: k.HostIP, HostPort: k.Port, Protocol: k.Protocol, Owner: owner}
			if host, port, err := net.SplitHostPort(m[1]); err == nil {
				f.ContainerIP = net.ParseIP(host)
				f.ContainerPort, _ = strconv.Atoi(port)
			}
			fs = append(fs, f)
		}
	}
	return fs
}
