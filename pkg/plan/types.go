package plan

import (
	"bytes"
	"cmp"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Family is an IP family.
type Family int

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// Families lists both families in a fixed order.
var Families = []Family{IPv4, IPv6}

// FamilyOf reports the family of ip.
func FamilyOf(ip net.IP) Family {
	if ip.To4() != nil {
		return IPv4
	}
	return IPv6
}

// Owner identifies an attachment: every kernel object we create names it, so
// that DEL and GC act on exactly their own objects.
type Owner struct {
	Network     string
	ContainerID string
	IfName      string
}

// Protocol is a transport protocol that can be port-mapped.
type Protocol string

const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	SCTP Protocol = "sctp"
)

// Protocols in the order rules are rendered.
var Protocols = []Protocol{TCP, UDP, SCTP}

// Mapping forwards HostIP:HostPort/Protocol to ContainerPort. A nil HostIP
// means every local address.
type Mapping struct {
	HostIP        net.IP
	HostPort      int
	ContainerPort int
	Protocol      Protocol
}

func (m Mapping) String() string {
	host := "*"
	if m.HostIP != nil {
		host = m.HostIP.String()
	}
	return fmt.Sprintf("%s:%d/%s->%d", host, m.HostPort, m.Protocol, m.ContainerPort)
}

// Masquerade says how connections that need SNAT (hairpin, localhost) are
// marked. Exactly one of MarkBit and ExternalSetMarkChain is meaningful.
type Masquerade struct {
	Enabled bool
	// MarkBit is the bit of the packet mark set for masquerading (0-31).
	MarkBit int
	// ExternalSetMarkChain, when set, is an existing chain that sets the mark
	// (e.g. KUBE-MARK-MASQ); then no SETMARK/MASQ chains are made.
	ExternalSetMarkChain string
	// All masquerades hairpin traffic from any source, not only the
	// container's subnet (masqAll).
	All bool
}

// Mark returns the mark value (and mask) of MarkBit.
func (m Masquerade) Mark() uint32 { return 1 << uint(m.MarkBit) }

// Localhost is a value of the "localhost" key: how a process on the node
// reaches a host port at a loopback address.
type Localhost string

const (
	// LocalhostNAT DNATs the connection out of the host, with
	// route_localnet on for 127.0.0.1 (IPv4 only): the default.
	LocalhostNAT Localhost = "nat"
	// LocalhostSocket rewrites the destination at connect()/sendmsg() in
	// cgroup socket hooks: 127.0.0.1 and ::1, no route_localnet.
	LocalhostSocket Localhost = "socket"
	// LocalhostAuto is LocalhostSocket where the host can, else
	// LocalhostNAT; it is resolved before plans are built.
	LocalhostAuto Localhost = "auto"
)

// Socket is where the socket path's programs attach and are pinned.
type Socket struct {
	// CgroupPath is the cgroup v2 directory the programs attach to.
	CgroupPath string
	// PinDir is the bpffs directory their maps and links are pinned in.
	PinDir string
}

// HasControl reports whether s holds a control character: text that
// reaches a rule (a condition, a comment) must not, or it could end the
// rule and start another.
func HasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}

// ParseProtocol accepts tcp, udp and sctp in any case; "" means tcp.
func ParseProtocol(s string) (Protocol, bool) {
	switch s { // the spellings runtimes send, without a copy
	case "tcp":
		return TCP, true
	case "udp":
		return UDP, true
	}
	switch strings.ToLower(s) {
	case "", "tcp":
		return TCP, true
	case "udp":
		return UDP, true
	case "sctp":
		return SCTP, true
	}
	return "", false
}

// ConfigError is a failure that a configuration key causes on this node,
// found only when a backend meets the kernel (a chain the key names that
// is not there): the plugin answers it as an invalid configuration (code
// 7), with the key, its value, why and what to do.
type ConfigError struct {
	Key, Value string
	Why        string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("invalid %s %q: %s", e.Key, e.Value, e.Why)
}

// Run is consecutive host ports of one protocol and host IP
// forwarded to consecutive container ports — a constant offset, the shape
// a Podman or nerdctl port range (-p 10000-10999:10000-10999) expands to.
// A single mapping is a run of one. The backends render a run as one
// rule, or one map element, whatever its length.
type Run struct {
	HostIP   net.IP // nil: every local address
	Protocol Protocol
	// HostPort and ContainerPort are those of the run's first mapping.
	HostPort, ContainerPort int
	Len                     int
}

// Last is the run's last host port.
func (r Run) Last() int { return r.HostPort + r.Len - 1 }

// Identity reports whether every host port of the run is forwarded to
// the same container port.
func (r Run) Identity() bool { return r.HostPort == r.ContainerPort }

// Ports spells the host ports as "8080" or "20000-20999" (sep between
// the first and the last).
func (r Run) Ports(sep string) string {
	if r.Len == 1 {
		return strconv.Itoa(r.HostPort)
	}
	return strconv.Itoa(r.HostPort) + sep + strconv.Itoa(r.Last())
}

// ContainerPortOf is the container port host port h of the run goes to.
func (r Run) ContainerPortOf(h int) int { return r.ContainerPort + h - r.HostPort }

// Mappings expands the run.
func (r Run) Mappings() []Mapping {
	out := make([]Mapping, r.Len)
	for i := range out {
		out[i] = Mapping{HostIP: r.HostIP, Protocol: r.Protocol, HostPort: r.HostPort + i, ContainerPort: r.ContainerPort + i}
	}
	return out
}

// compareMappings orders mappings by host IP, protocol, host port and
// container port.
func compareMappings(a, b Mapping) int {
	return cmp.Or(compareIPs(a.HostIP, b.HostIP), cmp.Compare(a.Protocol, b.Protocol),
		cmp.Compare(a.HostPort, b.HostPort), cmp.Compare(a.ContainerPort, b.ContainerPort))
}

// compareIPs orders host IPs in their 16-byte form, nil (every address)
// first.
func compareIPs(a, b net.IP) int {
	if a == nil && b == nil {
		return 0
	}
	return bytes.Compare(a.To16(), b.To16())
}
