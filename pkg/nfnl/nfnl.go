// Package nfnl speaks nfnetlink (NETLINK_NETFILTER) to the kernel of the
// calling thread's network namespace: transactional batches of nf_tables
// messages, dumps and single gets, and the attribute encoding both use.
// It knows the framing, and of nf_tables only what both backends use the
// same way (a rule's handle and verdicts, nft.go; the write probe and the
// kernel release it needs, probe.go); what the messages mean is its
// callers'.
package nfnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Msg is one request: its nfnetlink type (subsystem<<8 | message), its
// flags besides NLM_F_REQUEST, the nfgenmsg family, and its attributes.
type Msg struct {
	Type   uint16
	Flags  uint16
	Family uint8
	Attrs  []byte
}

// Error is the kernel's answer to one message of a batch or request.
type Error struct {
	Index int // position of the message in what was sent
	Errno unix.Errno
	Text  string // the kernel's extended ack message, when it gave one
}

func (e *Error) Error() string {
	if e.Text != "" {
		return fmt.Sprintf("%v (%s)", e.Errno, e.Text)
	}
	return e.Errno.Error()
}

func (e *Error) Unwrap() error { return e.Errno }

// Conn is a netlink socket of the netfilter family. It is safe for
// goroutines to share: one request and its answers at a time (a reader
// must not take another's answers), and no read waits longer than
// ReadTimeout.
type Conn struct {
	fd  int
	mu  sync.Mutex // one request and its answers at a time
	seq atomic.Uint32
	// readSize, when set, is the dumps' read buffer (tests).
	readSize int
	// scratch is the dumps' read buffer, kept between reads (under mu):
	// what a read returns is copied out at its size.
	scratch []byte
}

// Open opens the socket in the calling thread's network namespace.
func Open() (*Conn, error) { return OpenProtocol(unix.NETLINK_NETFILTER) }

// OpenProtocol opens a netlink socket of protocol proto in the calling
// thread's network namespace: NETLINK_NETFILTER for everything here, or
// another family (NETLINK_ROUTE, NETLINK_SOCK_DIAG) for Exec and
// DumpRaw, whose messages the caller frames.
func OpenProtocol(proto int) (*Conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, fmt.Errorf("open netlink socket (protocol %d): %w", proto, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind netlink socket (protocol %d): %w", proto, err)
	}
	// Errors echo only the failed message's header, and carry the
	// kernel's reason as text where it has one.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	// Room for the errors of a large failed batch; FORCE needs
	// CAP_NET_ADMIN, which changing nf_tables needs anyway.
	if proto == unix.NETLINK_NETFILTER && unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	// No read waits without a bound: the kernel answers at once, so a
	// read that has waited ReadTimeout is an error, not a hang.
	tv := unix.NsecToTimeval(ReadTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink socket read timeout: %w", err)
	}
	c := &Conn{fd: fd}
	c.seq.Store(1)
	return c, nil
}

// ReadTimeout bounds every read of a Conn.
const ReadTimeout = 10 * time.Second

// Close closes the socket.
func (c *Conn) Close() error { return unix.Close(c.fd) }

const (
	nlmsgHdrLen = unix.SizeofNlMsghdr
	nfgenLen    = 4
)

func align(n int) int { return (n + 3) &^ 3 }

// appendMsg frames m with seq and returns the grown buffer.
func appendMsg(b []byte, m Msg, flags uint16, seq uint32, resID uint16) []byte {
	l := nlmsgHdrLen + nfgenLen + len(m.Attrs)
	b = binary.NativeEndian.AppendUint32(b, uint32(l))
	b = binary.NativeEndian.AppendUint16(b, m.Type)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_REQUEST|m.Flags|flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, m.Family, unix.NFNETLINK_V0)
	b = binary.BigEndian.AppendUint16(b, resID)
	b = append(b, m.Attrs...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// Batch sends msgs as one nf_tables transaction: the kernel applies all
// of them or, when one fails, none. With commit false the batch is not
// ended, so the kernel checks every message and then aborts: nothing
// changes (nft --check does the same). The kernel handles a batch inside
// the send, so its answers are queued when the send returns; messages
// carry no NLM_F_ACK and only failures answer.
func (c *Conn) Batch(msgs []Msg, commit bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := uint32(len(msgs))
	begin := c.seq.Add(n+2) - n - 1 // begin, the messages, end
	first := begin + 1
	size := 2 * (nlmsgHdrLen + nfgenLen)
	for _, m := range msgs {
		size += nlmsgHdrLen + nfgenLen + align(len(m.Attrs))
	}
	b := make([]byte, 0, size)
	b = appendMsg(b, Msg{Type: unix.NFNL_MSG_BATCH_BEGIN}, 0, begin, unix.NFNL_SUBSYS_NFTABLES)
	for i, m := range msgs {
		b = appendMsg(b, m, 0, first+uint32(i), 0)
	}
	if commit {
		b = appendMsg(b, Msg{Type: unix.NFNL_MSG_BATCH_END}, 0, first+n, unix.NFNL_SUBSYS_NFTABLES)
	}
	if len(b) > 128<<10 { // netlink refuses a message larger than the send buffer
		_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, len(b)+64<<10)
	}
	if err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send nf_tables batch: %w", err)
	}
	var firstErr *Error
	lost := false
	buf := make([]byte, 64<<10)
	for {
		got, err := recv(c.fd, buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if errors.Is(err, unix.ENOBUFS) {
			// More errors than the receive buffer holds: the newest were
			// dropped, the first are still queued. Only failures answer,
			// so the batch failed.
			lost = true
			continue
		}
		if err != nil {
			return fmt.Errorf("read nf_tables batch answer: %w", err)
		}
		for _, m := range split(buf[:got]) {
			if m.typ != unix.NLMSG_ERROR {
				continue
			}
			e := m.err()
			if e == nil || e.Errno == 0 || m.errSeq < begin || m.errSeq > first+n {
				// an ack, or the answer to something sent before
				// this batch (a request whose answer was never read)
				continue
			}
			e.Index = int(m.errSeq) - int(first)
			if firstErr == nil || e.Index < firstErr.Index {
				firstErr = e
			}
		}
	}
	if firstErr != nil {
		return firstErr
	}
	if lost {
		return fmt.Errorf("read nf_tables batch answer: %w", unix.ENOBUFS)
	}
	return nil
}

// Reply is one answer message: its type and its attributes.
type Reply struct {
	Type   uint16
	Family uint8
	Attrs  []byte
}

// maxGetBytes bounds one write of Get: the kernel refuses a write larger
// than the socket's send buffer, and its answers must fit the receive
// buffer before they are read.
const maxGetBytes = 32 << 10

// Get sends requests (not dumps) and returns, for each, its reply or its
// error; the kernel answers them in order. Requests are written in groups
// of at most maxGetBytes, each group's answers read before the next is
// sent, so any number of requests fits the socket's limits.
func (c *Conn) Get(reqs []Msg) ([]Reply, []error, error) {
	replies, errs := make([]Reply, len(reqs)), make([]error, len(reqs))
	for _, g := range groups(reqs, maxGetBytes) {
		if err := c.get(reqs[g[0]:g[1]], replies[g[0]:g[1]], errs[g[0]:g[1]]); err != nil {
			return nil, nil, err
		}
		for i := g[0]; i < g[1]; i++ {
			if e, ok := errs[i].(*Error); ok {
				e.Index = i
			}
		}
	}
	return replies, errs, nil
}

// groups splits reqs into runs [from, to) whose framed size stays within
// limit (a single larger request makes a group of its own).
func groups(reqs []Msg, limit int) [][2]int {
	var out [][2]int
	from, size := 0, 0
	for i, m := range reqs {
		n := align(nlmsgHdrLen + nfgenLen + len(m.Attrs))
		if i > from && size+n > limit {
			out = append(out, [2]int{from, i})
			from, size = i, 0
		}
		size += n
	}
	if from < len(reqs) {
		out = append(out, [2]int{from, len(reqs)})
	}
	return out
}

func (c *Conn) get(reqs []Msg, replies []Reply, errs []error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.seq.Add(uint32(len(reqs))) - uint32(len(reqs)) + 1
	var b []byte
	for i, m := range reqs {
		b = appendMsg(b, m, 0, first+uint32(i), 0)
	}
	if err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send nf_tables request: %w", err)
	}
	done := make([]bool, len(reqs))
	left := len(reqs)
	buf := make([]byte, 64<<10)
	for left > 0 {
		n, err := recv(c.fd, buf, 0)
		if err != nil {
			return fmt.Errorf("read nf_tables answer: %w", err)
		}
		for _, m := range split(buf[:n]) {
			i := int(m.seq) - int(first)
			if m.typ == unix.NLMSG_ERROR {
				i = int(m.errSeq) - int(first)
			}
			if i < 0 || i >= len(reqs) || done[i] {
				continue
			}
			if m.typ == unix.NLMSG_ERROR {
				if e := m.err(); e != nil && e.Errno != 0 {
					e.Index = i
					errs[i] = e
				} else {
					continue // an ack: the reply came or comes separately
				}
			} else {
				replies[i] = Reply{Type: m.typ, Family: m.family, Attrs: append([]byte(nil), m.attrs...)}
			}
			done[i] = true
			left--
		}
	}
	return nil
}

// GetOne sends one request and returns its reply, or the kernel's error
// for it (an *Error: errors.Is(err, unix.ENOENT) for a missing object).
func (c *Conn) GetOne(m Msg) (Reply, error) {
	replies, errs, err := c.Get([]Msg{m})
	if err != nil {
		return Reply{}, err
	}
	return replies[0], errs[0]
}

type rawMsg struct {
	typ, flags uint16
	seq        uint32
	family     uint8
	attrs      []byte // after nfgenmsg
	body       []byte // after the netlink header
	errSeq     uint32 // NLMSG_ERROR: the failed message's seq
}

// doneErr decodes an NLMSG_DONE body: the dump's error (a dump the
// kernel could not finish, ending in an error of its own), nil when it
// ended well; with NLM_F_ACK_TLVS the extended ack's message follows.
func (m rawMsg) doneErr() *Error {
	if len(m.body) < 4 {
		return nil
	}
	errno := -int32(binary.NativeEndian.Uint32(m.body[0:4]))
	if errno == 0 {
		return nil
	}
	e := &Error{Errno: unix.Errno(errno)}
	if m.flags&unix.NLM_F_ACK_TLVS != 0 {
		for _, a := range Parse(m.body[4:]) {
			if a.Type == unix.NLMSGERR_ATTR_MSG {
				e.Text = a.String()
			}
		}
	}
	return e
}

// err decodes an NLMSG_ERROR body: errno, the echoed header, and the
// extended ack's message attribute.
func (m rawMsg) err() *Error {
	if len(m.body) < 4+nlmsgHdrLen {
		return nil
	}
	e := &Error{Errno: unix.Errno(-int32(binary.NativeEndian.Uint32(m.body[0:4])))}
	if m.flags&unix.NLM_F_ACK_TLVS != 0 {
		echoed := nlmsgHdrLen
		if m.flags&unix.NLM_F_CAPPED == 0 {
			echoed = int(binary.NativeEndian.Uint32(m.body[4:8]))
		}
		if 4+align(echoed) <= len(m.body) {
			for _, a := range Parse(m.body[4+align(echoed):]) {
				if a.Type == unix.NLMSGERR_ATTR_MSG {
					e.Text = a.String()
				}
			}
		}
	}
	return e
}

func split(b []byte) []rawMsg {
	var out []rawMsg
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < nlmsgHdrLen || l > len(b) {
			break
		}
		m := rawMsg{typ: binary.NativeEndian.Uint16(b[4:6]), flags: binary.NativeEndian.Uint16(b[6:8]),
			seq: binary.NativeEndian.Uint32(b[8:12]), body: b[nlmsgHdrLen:l]}
		if m.typ == unix.NLMSG_ERROR && len(m.body) >= 4+nlmsgHdrLen {
			m.errSeq = binary.NativeEndian.Uint32(m.body[4+8 : 4+12])
		}
		if len(m.body) >= nfgenLen {
			m.family = m.body[0]
			m.attrs = m.body[nfgenLen:]
		}
		out = append(out, m)
		b = b[min(align(l), len(b)):]
	}
	return out
}
