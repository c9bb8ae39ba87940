package plan

import "net"

// Unknown is the owner's network and container ID where the kernel state
// records none (an iptables chain whose entry rule is gone).
const Unknown = "?"

// Installed is one forwarded host port as a backend reads it back from the
// kernel: what `portmap-agent list` shows and the "reject" policy compares.
type Installed struct {
	// HostIP is nil for every address.
	HostIP        net.IP
	HostPort      int
	Protocol      Protocol
	ContainerIP   net.IP
	ContainerPort int
	// Owner names Network and ContainerID (Unknown where the state has
	// none); IfName is empty.
	Owner Owner
}
