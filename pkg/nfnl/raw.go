package nfnl

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// The few requests of other netlink families (routes, socket
// diagnostics) and conntrack's, whose bodies the caller frames: a
// family header (rtmsg, inet_diag_req_v2, nfgenmsg) and attributes.

// appendRaw frames a message whose body is body.
func appendRaw(b []byte, typ, flags uint16, seq uint32, body []byte) []byte {
	b = binary.NativeEndian.AppendUint32(b, uint32(nlmsgHdrLen+len(body)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_REQUEST|flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, body...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// DumpRaw sends a dump request of type typ with body and returns the
// body of every answer; a dump interrupted by concurrent changes is
// retried, and after a few tries what the last one read comes with
// ErrInterrupted.
func (c *Conn) DumpRaw(typ uint16, body []byte) ([][]byte, error) {
	for try := 0; ; try++ {
		seq := c.seq.Add(1)
		msgs, err := c.dumpFrames(appendRaw(nil, typ, unix.NLM_F_DUMP, seq, body), seq)
		if errors.Is(err, ErrInterrupted) && try < 5 {
			continue
		}
		out := make([][]byte, len(msgs))
		for i, m := range msgs {
			out[i] = m.body
		}
		return out, err
	}
}

// Exec sends one request of type typ with body, acknowledged, and
// returns the body of its reply (nil when the kernel only acknowledged
// it) or the kernel's error (an *Error).
func (c *Conn) Exec(typ uint16, body []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq := c.seq.Add(1)
	if err := unix.Sendto(c.fd, appendRaw(nil, typ, unix.NLM_F_ACK, seq, body), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("send netlink request: %w", err)
	}
	var reply []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := recv(c.fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("read netlink answer: %w", err)
		}
		for _, m := range split(buf[:n]) {
			switch {
			case m.typ == unix.NLMSG_ERROR && m.errSeq == seq:
				if e := m.err(); e != nil && e.Errno != 0 {
					return nil, e
				}
				return reply, nil
			case m.seq == seq && reply == nil:
				reply = append([]byte(nil), m.body...)
			}
		}
	}
}
