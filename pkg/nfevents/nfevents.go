// Package nfevents tells when this network namespace's firewall changes:
// it subscribes to the nf_tables netlink multicast group, which the kernel
// notifies on every committed change — nft, iptables-nft (iptables over
// nf_tables) and firewalld's nftables backend all commit through it.
// iptables-legacy does not; a watcher needs a timer for it.
package nfevents

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Subscription delivers a token on C after one or more changes; changes
// that arrive while a token is pending coalesce into it.
type Subscription struct {
	C <-chan struct{}
	f *os.File
}

// Subscribe opens the subscription in the calling thread's network
// namespace.
func Subscribe() (*Subscription, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("open netfilter netlink socket: %w", err)
	}
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("subscribe to nf_tables events: %w", err)
	}
	// A non-blocking socket as an *os.File waits in Go's poller: the
	// reader sleeps until a message comes or Close, with no thread of its
	// own and no timer.
	f := os.NewFile(uintptr(fd), "nf_tables events")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("nf_tables events: %w", err)
	}
	c := make(chan struct{}, 1)
	s := &Subscription{C: c, f: f}
	go s.read(rc, c)
	return s, nil
}

// read waits on the socket and turns every message (or an overrun, which
// means messages were lost) into a pending token, until Close.
func (s *Subscription) read(rc syscall.RawConn, c chan struct{}) {
	buf := make([]byte, 1<<16)
	defer close(c)
	for {
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			_, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return !errors.Is(rerr, unix.EAGAIN)
		}); err != nil {
			return // closed
		}
		switch {
		case errors.Is(rerr, unix.EINTR):
			continue
		case rerr != nil && !errors.Is(rerr, unix.ENOBUFS):
			return
		}
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Drain drops a pending token.
func (s *Subscription) Drain() {
	select {
	case <-s.C:
	default:
	}
}

// Close ends the subscription; C is closed once the reader returns.
func (s *Subscription) Close() { s.f.Close() }
