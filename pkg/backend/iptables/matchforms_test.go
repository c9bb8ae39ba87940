package iptables

import (
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/xt"
)

// A rule of an attachment's chain as iptables-nft 1.8.8–1.8.10 and 1.8.11
// write it (read off nft --debug=netlink here) compares equal to the
// native writer's (1.8.7's spelling); a rule that differs in a port, an
// address or the protocol does not.
func TestMatchFormsOfOtherReleases(t *testing.T) {
	chains := map[string]bool{SetMarkChain: true}
	rule := func(port int, src string) xt.Rule {
		return xt.Rule{Chain: "CNI-DN-x", Proto: plan.TCP, Dport: strconv.Itoa(port), Src: src, Jump: SetMarkChain}
	}
	// later releases: the port as a payload load and a cmp; 1.8.11 also
	// loads the protocol from the IPv4 header and puts the address first
	later := func(proto8 bool, addrFirst bool, port uint16, net3 []byte) []byte {
		var a nfnl.Attrs
		l := nft.List{To: &a}
		addr := func() {
			l.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, 12, 3, unix.NFT_REG_1)
			l.Cmp(unix.NFT_CMP_EQ, unix.NFT_REG_1, net3)
		}
		if addrFirst {
			addr()
		}
		if proto8 {
			l.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, 9, 1, unix.NFT_REG_1)
		} else {
			l.Meta(unix.NFT_META_L4PROTO, unix.NFT_REG_1)
		}
		l.Cmp(unix.NFT_CMP_EQ, unix.NFT_REG_1, []byte{unix.IPPROTO_TCP})
		if !addrFirst {
			addr()
		}
		l.Payload(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, unix.NFT_REG_1)
		l.Cmp(unix.NFT_CMP_EQ, unix.NFT_REG_1, []byte{byte(port >> 8), byte(port)})
		l.Counter()
		l.Verdict(unix.NFT_JUMP, SetMarkChain)
		return a.Bytes()
	}
	for _, tc := range []struct {
		name string
		got  []byte
		same bool
	}{
		{"1.8.9", later(false, false, 8080, []byte{192, 0, 2}), true},
		{"1.8.11", later(true, true, 8080, []byte{192, 0, 2}), true},
		{"another port", later(true, true, 8081, []byte{192, 0, 2}), false},
		{"another address", later(false, false, 8080, []byte{192, 0, 3}), false},
	} {
		same, err := xt.SameRules(plan.IPv4, [][]byte{tc.got}, []xt.Rule{rule(8080, "192.0.2.0/24")}, chains, false)
		if err != nil || same != tc.same {
			t.Errorf("%s: same %v %v, want %v", tc.name, same, err, tc.same)
		}
	}
	// on IPv6 the header's byte 9 is not the protocol
	var a nfnl.Attrs
	l := nft.List{To: &a}
	l.Payload(unix.NFT_PAYLOAD_NETWORK_HEADER, 9, 1, unix.NFT_REG_1)
	l.Cmp(unix.NFT_CMP_EQ, unix.NFT_REG_1, []byte{unix.IPPROTO_TCP})
	l.Counter()
	l.Verdict(unix.NFT_JUMP, SetMarkChain)
	if same, _ := xt.SameRules(plan.IPv6, [][]byte{a.Bytes()}, []xt.Rule{{Chain: "CNI-DN-x", Proto: plan.TCP, Jump: SetMarkChain}}, chains, false); same {
		t.Error("IPv6: a load of the header's byte 9 compares equal to the protocol")
	}
}
