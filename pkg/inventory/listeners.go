package inventory

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
)

const tcpListen = 10 // TCP_LISTEN in the kernel's socket states

// Sizes of struct inet_diag_req_v2 and struct inet_diag_msg
// (linux/inet_diag.h).
const (
	diagReqLen = 56
	diagMsgLen = 72
)

// Listener finds a socket of this host's network namespace that would
// receive traffic for hostIP ("*" for any address) and port: a listening
// TCP socket, or a bound UDP socket. It asks the kernel through netlink
// socket diagnostics (the same source as ss), in both families, because an
// IPv6 wildcard socket may take IPv4 too. SCTP has no socket diagnostics
// and is not looked at. It returns "" when there is none.
func Listener(proto, hostIP string, port int) (string, error) {
	var protocol uint8
	states := uint32(1 << tcpListen)
	switch proto {
	case "tcp":
		protocol = unix.IPPROTO_TCP
	case "udp":
		protocol, states = unix.IPPROTO_UDP, ^uint32(0)
	default:
		return "", nil
	}
	c, err := nfnl.OpenProtocol(unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return "", fmt.Errorf("socket diagnostics: %w", err)
	}
	defer c.Close()
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		// struct inet_diag_req_v2: family, protocol, extensions, pad,
		// states, then a socket id of zeros (every socket)
		req := make([]byte, diagReqLen)
		req[0], req[1] = fam, protocol
		binary.NativeEndian.PutUint32(req[4:], states)
		socks, err := c.DumpRaw(unix.SOCK_DIAG_BY_FAMILY, req)
		if err != nil && !errors.Is(err, nfnl.ErrInterrupted) {
			return "", fmt.Errorf("socket diagnostics: %w", err)
		}
		for _, m := range socks {
			s, ok := parseDiag(m)
			if !ok || s.port != port || (proto == "tcp" && s.state != tcpListen) {
				continue
			}
			if proto == "udp" && !s.dst.IsUnspecified() {
				continue // a connected UDP socket only takes its peer's packets
			}
			if hostIP == "*" || s.src.IsUnspecified() || s.src.Equal(net.ParseIP(hostIP)) {
				return net.JoinHostPort(s.src.String(), fmt.Sprint(port)), nil
			}
		}
	}
	return "", nil
}

// diagSocket is what an inet_diag_msg says of a socket.
type diagSocket struct {
	state    uint8
	port     int
	src, dst net.IP
}

// parseDiag reads struct inet_diag_msg: family, state, timer, retrans,
// then the socket id (ports big-endian, then addresses of 16 bytes).
func parseDiag(b []byte) (diagSocket, bool) {
	if len(b) < diagMsgLen {
		return diagSocket{}, false
	}
	n := 16
	if b[0] == unix.AF_INET {
		n = 4
	}
	return diagSocket{state: b[1], port: int(binary.BigEndian.Uint16(b[4:6])),
		src: net.IP(b[8 : 8+n]), dst: net.IP(b[24 : 24+n])}, true
}
