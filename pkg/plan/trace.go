package plan

import "net"

// Packet is the first packet of a new connection, as the backends'
// in-memory kernels trace it through their rules.
type Packet struct {
	Protocol Protocol
	Src, Dst net.IP
	Dport    int
	// FromHost is true for a packet this host sends (the output hook),
	// false for one it receives (prerouting).
	FromHost bool
}

// Verdict is what a backend's nat rules did to a Packet.
type Verdict struct {
	// Chain is the attachment's chain that took it; "" when none did.
	Chain string
	// DNAT is where it goes ("192.0.2.2:80"); "" when not translated.
	DNAT string
	// Masquerade is true when postrouting masquerades it.
	Masquerade bool
}
