// Package nfevents tells when this network namespace's firewall changes:
// it subscribes to the nf_tables netlink multicast group, which the kernel
// notifies on every committed change — nft, iptables-nft (iptables over
// nf_tables) and firewalld's nftables backend all commit through it.
// iptables-legacy does not; a watcher needs a timer for it.
package nfevents

import (
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Subscription delivers a token on C after one or more changes; changes
// that arrive while a token is pending coalesce into it.
type Subscription struct {
	C    <-chan struct{}
	fd   int
	done atomic.Bool
}

// Subscribe opens the subscription in the calling thread's network
// namespace.
func Subscribe() (*Subscription, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("open netfilter netlink socket: %w", err)
	}
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("subscribe to nf_tables events: %w", err)
	}
	// The reader wakes up twice a second to see whether it was closed:
	// closing a socket does not end a blocked recvfrom.
	tv := unix.Timeval{Usec: 500000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set receive timeout: %w", err)
	}
	c := make(chan struct{}, 1)
	s := &Subscription{C: c, fd: fd}
	go s.read(c)
	return s, nil
}

// read blocks on the socket and turns every message (or an overrun, which
// means messages were lost) into a pending token.
func (s *Subscription) read(c chan struct{}) {
	buf := make([]byte, 1<<16)
	defer close(c)
	defer unix.Close(s.fd)
	for !s.done.Load() {
		_, _, err := unix.Recvfrom(s.fd, buf, 0)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		case err != nil && !errors.Is(err, unix.ENOBUFS):
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

// Close ends the subscription; C is closed (and the socket) once the
// reader sees it, within half a second.
func (s *Subscription) Close() { s.done.Store(true) }
