// Package nfevents tells when this network namespace's firewall changes:
// it subscribes to the nf_tables netlink multicast group, which the kernel
// notifies on every committed change — nft, iptables-nft (iptables over
// nf_tables) and firewalld's nftables backend all commit through it.
// iptables-legacy does not; a watcher needs a timer for it.
//
// Only changes that can touch what portmap writes or reads give a token
// (Relevant): in the nat and filter tables of ip and ip6 (where
// iptables-nft keeps the rules of both iptables layouts, ours and
// upstream's) the CNI-HOSTPORT-* and CNI-DN-* chains and the built-in
// ones that jump to them, the cni_portmap and cni_hostport tables of any
// family, and the deletion of any table (a flush of the ruleset).
// kube-proxy's, firewalld's, Docker's and Calico's own tables and chains
// commit often and wake nobody.
package nfevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// RecvBuffer is the event socket's receive buffer: 8 MiB, some 30,000
// rule messages between two reads.
const RecvBuffer = 8 << 20

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
	// Room for a busy node's bursts: kube-proxy's iptables mode refilling
	// its chains sends a message per rule deleted and added, thousands a
	// second, and an overrun (ENOBUFS) must start a pass, since what was
	// lost may have been ours. With CAP_NET_ADMIN past net.core.rmem_max.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, RecvBuffer); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, RecvBuffer)
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

// read waits on the socket and turns every relevant message (or an
// overrun, which means messages were lost) into a pending token, until
// Close.
func (s *Subscription) read(rc syscall.RawConn, c chan struct{}) {
	buf := make([]byte, 1<<16)
	defer close(c)
	for {
		var rerr error
		var n int
		if err := rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return !errors.Is(rerr, unix.EAGAIN)
		}); err != nil {
			return // closed
		}
		switch {
		case errors.Is(rerr, unix.EINTR):
			continue
		case rerr != nil && !errors.Is(rerr, unix.ENOBUFS):
			return
		case rerr == nil && !Relevant(buf[:n]):
			continue
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

// nf_tables' messages (linux/netfilter/nf_tables.h) that name no table or
// delete one; every other object message carries its table's name as its
// first attribute (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE,
// NFTA_SET_TABLE, NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE,
// NFTA_FLOWTABLE_TABLE are all 1). Chain and rule messages name their
// chain too (NFTA_CHAIN_NAME, NFTA_RULE_CHAIN).
const (
	msgDelTable     = unix.NFT_MSG_DELTABLE
	msgNewGen       = unix.NFT_MSG_NEWGEN
	msgDestroyTable = 26 // NFT_MSG_DESTROYTABLE, Linux 6.3
	msgDestroyChain = 27 // NFT_MSG_DESTROYCHAIN
	msgDestroyRule  = 28 // NFT_MSG_DESTROYRULE
	attrTable       = 1
)

// Relevant reports whether a datagram of nf_tables events holds a change
// a pass may have to answer: one to a table portmap writes, to one of
// portmap's chains or a built-in chain of iptables' nat and filter tables
// (where the jumps to them are), or the deletion of any table. A
// datagram it cannot read is relevant.
func Relevant(b []byte) bool {
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(nlUint32(b[0:4]))
		if l < unix.SizeofNlMsghdr || l > len(b) {
			return true
		}
		typ := nlUint16(b[4:6])
		if msgRelevant(typ, b[unix.SizeofNlMsghdr:l]) {
			return true
		}
		b = b[min(len(b), (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
	}
	return false
}

// msgRelevant judges one message of type typ and body (nfgenmsg, then
// attributes).
func msgRelevant(typ uint16, body []byte) bool {
	if typ>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return false
	}
	m := typ & 0xff
	switch m {
	case msgNewGen:
		return false // the end of a batch: its objects came before it
	case msgDelTable, msgDestroyTable:
		return true
	}
	if len(body) < 4 {
		return true
	}
	table, ok := firstString(body[4:], attrTable)
	if !ok {
		return true
	}
	switch table {
	case "cni_portmap", "cni_hostport":
		return true
	case "nat", "filter":
		if body[0] != unix.NFPROTO_IPV4 && body[0] != unix.NFPROTO_IPV6 {
			return false
		}
	default:
		return false
	}
	// iptables' tables: kube-proxy's iptables mode, Docker and Calico
	// commit to chains of their own there, many times a second on a busy
	// node; only portmap's chains and the built-in ones that jump to
	// them are portmap's business
	var attrChain uint16
	switch m {
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN, msgDestroyChain:
		attrChain = unix.NFTA_CHAIN_NAME
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE, msgDestroyRule:
		attrChain = unix.NFTA_RULE_CHAIN
	default:
		return true // the table itself, or a set: rare, and maybe ours
	}
	chain, ok := firstString(body[4:], attrChain)
	return !ok || ourChain(chain)
}

// ourChain reports whether a chain of iptables' nat or filter table holds
// portmap's rules or jumps to them: the chains of both layouts (ours and
// upstream's share the names) and the built-in chains.
func ourChain(name string) bool {
	switch name {
	case "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING":
		return true
	}
	return strings.HasPrefix(name, "CNI-HOSTPORT-") || strings.HasPrefix(name, "CNI-DN-")
}

// firstString finds attribute typ among attrs, as a string.
func firstString(attrs []byte, typ uint16) (string, bool) {
	for len(attrs) >= 4 {
		l := int(nlUint16(attrs[0:2]))
		if l < 4 || l > len(attrs) {
			return "", false
		}
		if nlUint16(attrs[2:4])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == typ {
			v := attrs[4:l]
			for len(v) > 0 && v[len(v)-1] == 0 {
				v = v[:len(v)-1]
			}
			return string(v), true
		}
		attrs = attrs[min(len(attrs), (l+3)&^3):]
	}
	return "", false
}

func nlUint16(b []byte) uint16 { return binary.NativeEndian.Uint16(b) }
func nlUint32(b []byte) uint32 { return binary.NativeEndian.Uint32(b) }
