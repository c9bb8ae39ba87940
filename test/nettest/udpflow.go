package nettest

import (
	"net"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// UDPFlow is one UDP client that keeps its 5-tuple, as a long-lived UDP
// client does (a DNS resolver's socket, a QUIC connection, a game): one
// socket, asked again and again.
type UDPFlow struct {
	conn net.PacketConn
	to   net.Addr
}

// NewUDPFlow opens the flow's socket at local in namespace n (nil: the
// test's own) towards to; it is closed when the test ends.
func NewUDPFlow(tb TB, n ns.NetNS, local, to string) *UDPFlow {
	tb.Helper()
	f := &UDPFlow{}
	open := func(ns.NetNS) error {
		var err error
		f.conn, err = net.ListenPacket("udp", local)
		return err
	}
	var err error
	if n == nil {
		err = open(nil)
	} else {
		err = n.Do(open)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.conn.Close() })
	if f.to, err = net.ResolveUDPAddr("udp", to); err != nil {
		tb.Fatal(err)
	}
	return f
}

// Ask sends one datagram and returns the reply, or "" after a second.
func (f *UDPFlow) Ask(tb TB) string {
	tb.Helper()
	if _, err := f.conn.WriteTo([]byte("hi\n"), f.to); err != nil {
		tb.Fatal(err)
	}
	buf := make([]byte, 200)
	_ = f.conn.SetReadDeadline(time.Now().Add(time.Second))
	n, _, err := f.conn.ReadFrom(buf)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(buf[:n]))
}
