package kernel

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/test/nettest"
)

// transportBatch is a batch of six idempotent adds (a table, three
// chains, two maps): about what an ADD's fast path sends.
func transportBatch(b *testing.B) []nfnl.Msg {
	tx := nft.NewTx(nft.IPv4, "bench")
	tx.Add(&nft.Table{Comment: "transport"})
	for _, c := range []string{"a", "b", "c"} {
		tx.Add(&nft.Chain{Name: c})
	}
	key := []nft.Type{nft.InetProto, nft.InetService}
	tx.Add(&nft.Set{Name: "m", Key: key, Data: []nft.Type{nft.Verdict}})
	tx.Add(&nft.Set{Name: "r", Key: key, Data: []nft.Type{nft.Verdict}, Interval: true})
	msgs, err := tx.Messages()
	if err != nil {
		b.Fatal(err)
	}
	return msgs
}

// BenchmarkBatchTransport commits the same batch through pkg/nfnl (no
// acknowledgement asked: the kernel answers only failures, queued by
// the time the send returns) and through github.com/mdlayher/netlink
// (which learns that a batch is done only from an acknowledgement of
// each message, read with a deadline): what a move of the transport to
// the library would cost each verb's commit.
func BenchmarkBatchTransport(b *testing.B) {
	n := nettest.NewNS(b)
	msgs := transportBatch(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.Run("nfnl", func(b *testing.B) {
		_ = n.Do(func(ns.NetNS) error {
			c, err := nfnl.Open()
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			for b.Loop() {
				if err := c.Batch(msgs, true); err != nil {
					b.Fatal(err)
				}
			}
			return nil
		})
	})
	for _, v := range []struct {
		name   string
		ackAll bool
	}{{"mdlayher-netlink-ack-each", true}, {"mdlayher-netlink-ack-last", false}} {
		b.Run(v.name, func(b *testing.B) {
			benchLibrary(b, n, msgs, v.ackAll)
		})
	}
}

// benchLibrary is BenchmarkBatchTransport's batch through the library:
// an acknowledgement asked of every message, or of the last alone (the
// kernel still answers any failure of the others).
func benchLibrary(b *testing.B, n ns.NetNS, msgs []nfnl.Msg, ackAll bool) {
	_ = n.Do(func(ns.NetNS) error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		_ = c.SetOption(netlink.CapAcknowledge, true)
		_ = c.SetOption(netlink.ExtendedAcknowledge, true)
		nfgen := func(family uint8, resID uint16) []byte {
			return binary.BigEndian.AppendUint16([]byte{family, unix.NFNETLINK_V0}, resID)
		}
		batch := make([]netlink.Message, 0, len(msgs)+2)
		batch = append(batch, netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN),
			Flags: netlink.Request}, Data: nfgen(0, unix.NFNL_SUBSYS_NFTABLES)})
		for _, m := range msgs {
			batch = append(batch, netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(m.Type),
				Flags: netlink.Request | netlink.HeaderFlags(m.Flags)},
				Data: append(nfgen(m.Family, 0), m.Attrs...)})
		}
		for i := 1; i <= len(msgs); i++ {
			if ackAll || i == len(msgs) {
				batch[i].Header.Flags |= netlink.Acknowledge
			}
		}
		acks := 1
		if ackAll {
			acks = len(msgs)
		}
		batch = append(batch, netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_END),
			Flags: netlink.Request}, Data: nfgen(0, unix.NFNL_SUBSYS_NFTABLES)})
		for b.Loop() {
			for i := range batch {
				batch[i].Header.Sequence, batch[i].Header.Length = 0, 0
			}
			if _, err := c.SendMessages(batch); err != nil {
				b.Fatal(err)
			}
			for acked := 0; acked < acks; {
				_ = c.SetReadDeadline(time.Now().Add(nfnl.ReadTimeout))
				got, err := c.Receive()
				if err != nil {
					b.Fatal(err)
				}
				acked += len(got)
			}
		}
		return nil
	})
}
