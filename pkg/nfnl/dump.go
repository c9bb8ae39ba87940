package nfnl

// Dumps: a request answered by many messages (every rule of a chain,
// every element of a set), read until NLMSG_DONE, and retried when a
// concurrent change interrupts it.

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Dump sends a dump request and returns every message until the end of
// the dump. A dump interrupted by a concurrent change is retried; after
// a few tries what the last one read comes with ErrInterrupted.
func (c *Conn) Dump(req Msg) ([]Reply, error) {
	for try := 0; ; try++ {
		out, err := c.dump(req)
		if errors.Is(err, ErrInterrupted) && try < 5 {
			continue
		}
		return out, err
	}
}

// ErrInterrupted is a dump's error when concurrent changes interrupted
// it every time it was tried: what it read may lack entries.
var ErrInterrupted = errors.New("dump interrupted by a concurrent change")

func (c *Conn) dump(req Msg) ([]Reply, error) {
	seq := c.seq.Add(1)
	msgs, err := c.dumpFrames(appendMsg(nil, req, unix.NLM_F_DUMP, seq, 0), seq)
	if err != nil && !errors.Is(err, ErrInterrupted) {
		return nil, err
	}
	out := make([]Reply, len(msgs))
	for i, m := range msgs {
		out[i] = Reply{Type: m.typ, Family: m.family, Attrs: m.attrs}
	}
	return out, err
}

// dumpFrames sends the framed dump request b (sequence number seq) and
// returns every answer until the end of the dump; what an interrupted
// dump returned comes with ErrInterrupted.
func (c *Conn) dumpFrames(b []byte, seq uint32) ([]rawMsg, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("send netlink dump request: %w", err)
	}
	var out []rawMsg
	interrupted := false
	for {
		// One read buffer for every read, and the bytes read copied out
		// at their size: the replies keep slices of the copy. The kernel
		// fills at most 32 KiB per read of a dump; a dump of a chain of
		// a few rules is a few hundred bytes.
		if len(c.scratch) != c.dumpBuf() {
			c.scratch = make([]byte, c.dumpBuf())
		}
		n, err := recv(c.fd, c.scratch, 0)
		if err != nil {
			return nil, fmt.Errorf("read netlink dump: %w", err)
		}
		for _, m := range split(append([]byte(nil), c.scratch[:n]...)) {
			if m.seq != seq {
				continue
			}
			if m.flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch m.typ {
			case unix.NLMSG_DONE:
				if e := m.doneErr(); e != nil {
					return nil, e
				}
				if interrupted {
					return out, ErrInterrupted
				}
				return out, nil
			case unix.NLMSG_ERROR:
				if e := m.err(); e != nil && e.Errno != 0 {
					return nil, e
				}
			default:
				out = append(out, m)
			}
		}
	}
}

// ErrNoAnswer is a read that waited ReadTimeout for the kernel.
var ErrNoAnswer = fmt.Errorf("no answer from the kernel in %s", ReadTimeout)

// ErrTruncated says a netlink datagram was larger than the buffer it
// was read into: what it held is lost, and what was read is incomplete.
var ErrTruncated = errors.New("netlink message larger than the read buffer")

// recv reads one datagram into buf. MSG_TRUNC makes the kernel return
// the datagram's real length, so one that did not fit is an error
// rather than a cut-off answer read as a whole one.
func recv(fd int, buf []byte, flags int) (int, error) {
	n, _, err := unix.Recvfrom(fd, buf, flags|unix.MSG_TRUNC)
	if err != nil && flags&unix.MSG_DONTWAIT == 0 && errors.Is(err, unix.EAGAIN) {
		return 0, fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
	if err != nil {
		return 0, err
	}
	if n > len(buf) {
		return 0, fmt.Errorf("%w (%d bytes, %d read)", ErrTruncated, n, len(buf))
	}
	return n, nil
}

// dumpBuf is the size of a dump's read buffer: the kernel fills a read
// of a dump with as many messages as fit the size the reader reads with
// (at least one page's worth), so 32 KiB takes any message nf_tables
// dumps.
func (c *Conn) dumpBuf() int {
	if c.readSize > 0 {
		return c.readSize
	}
	return 32 << 10
}
