package inventory

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const tcpListen = 10 // TCP_LISTEN in the kernel's socket states

// Listener finds a socket of this host's network namespace that would
// receive traffic for hostIP ("*" for any address) and port: a listening
// TCP socket, or a bound UDP socket. It asks the kernel through netlink
// socket diagnostics (the same source as ss), in both families, because an
// IPv6 wildcard socket may take IPv4 too. SCTP has no socket diagnostics
// and is not looked at. It returns "" when there is none.
func Listener(proto, hostIP string, port int) (string, error) {
	var dump func(uint8) ([]*netlink.Socket, error)
	switch proto {
	case "tcp":
		dump = netlink.SocketDiagTCP
	case "udp":
		dump = netlink.SocketDiagUDP
	default:
		return "", nil
	}
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := dump(fam)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return "", fmt.Errorf("socket diagnostics: %w", err)
		}
		for _, s := range socks {
			if int(s.ID.SourcePort) != port || (proto == "tcp" && s.State != tcpListen) {
				continue
			}
			if proto == "udp" && !s.ID.Destination.IsUnspecified() {
				continue // a connected UDP socket only takes its peer's packets
			}
			src := s.ID.Source
			if hostIP == "*" || src.IsUnspecified() || src.Equal(net.ParseIP(hostIP)) {
				return net.JoinHostPort(src.String(), fmt.Sprint(port)), nil
			}
		}
	}
	return "", nil
}
