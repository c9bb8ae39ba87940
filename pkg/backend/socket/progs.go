package socket

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/portmap-dev/portmap/pkg/bpf"
)

// Offsets in struct bpf_sock_addr (include/uapi/linux/bpf.h).
const (
	ctxUserIP4  = 4
	ctxUserIP6  = 8 // [4]u32
	ctxUserPort = 24
	ctxProtocol = 36
)

// Stack slots of the programs (offsets from the frame pointer).
const (
	stKey    = -32 // a svc key, or a rev key in the reverse hooks
	stRevKey = -64 // connect/sendmsg: the rev key they write
	stRevVal = -88 // connect/sendmsg: the rev value
)

// Hook is one cgroup socket-address hook the socket path attaches to.
type Hook struct {
	// Name is the link's pin name and, with the program's version, the
	// program's name.
	Name   string
	Attach uint32
	// Forward hooks rewrite a destination (connect, sendmsg); the others
	// rewrite it back (recvmsg, getpeername).
	Forward bool
	V6      bool
}

// Hooks are the eight hooks, both families: an IPv6 socket dialling
// ::ffff:127.0.0.1 goes through connect6 to the IPv4 entry.
var Hooks = []Hook{
	{"connect4", bpf.AttachInet4Connect, true, false},
	{"connect6", bpf.AttachInet6Connect, true, true},
	{"sendmsg4", bpf.AttachUDP4Sendmsg, true, false},
	{"sendmsg6", bpf.AttachUDP6Sendmsg, true, true},
	{"recvmsg4", bpf.AttachUDP4Recvmsg, false, false},
	{"recvmsg6", bpf.AttachUDP6Recvmsg, false, true},
	{"getpeername4", bpf.AttachInet4GetPeername, false, false},
	{"getpeername6", bpf.AttachInet6GetPeername, false, true},
}

// loadAddr copies the socket address of ctx (r6) into the 16 bytes at
// stack offset off, IPv4 as ::ffff:a.b.c.d.
func loadAddr(v6 bool, off int16) bpf.Program {
	if v6 {
		var out bpf.Program
		for i := int16(0); i < 4; i++ {
			out = append(out,
				bpf.Load(bpf.R7, bpf.R6, ctxUserIP6+4*i, bpf.Word),
				bpf.Store(bpf.RFP, off+4*i, bpf.R7, bpf.Word))
		}
		return out
	}
	return bpf.Program{
		bpf.StoreImm(bpf.RFP, off, 0, bpf.Word),
		bpf.StoreImm(bpf.RFP, off+4, 0, bpf.Word),
		bpf.StoreImm(bpf.RFP, off+8, 0xffff0000, bpf.Word), // 00 00 ff ff
		bpf.Load(bpf.R7, bpf.R6, ctxUserIP4, bpf.Word),
		bpf.Store(bpf.RFP, off+12, bpf.R7, bpf.Word),
	}
}

// storeAddr writes the address and port at r8 (a map value: address,
// then port) into ctx: the destination (forward hooks) or the peer
// (reverse hooks) the socket sees.
func storeAddr(v6 bool) bpf.Program {
	var out bpf.Program
	if v6 {
		for i := int16(0); i < 4; i++ {
			out = append(out,
				bpf.Load(bpf.R7, bpf.R8, 4*i, bpf.Word),
				bpf.Store(bpf.R6, ctxUserIP6+4*i, bpf.R7, bpf.Word))
		}
	} else {
		out = append(out,
			bpf.Load(bpf.R7, bpf.R8, 12, bpf.Word),
			bpf.Store(bpf.R6, ctxUserIP4, bpf.R7, bpf.Word))
	}
	return append(out,
		bpf.Load(bpf.R7, bpf.R8, 16, bpf.Word),
		bpf.Store(bpf.R6, ctxUserPort, bpf.R7, bpf.Word))
}

// copyWords copies n 4-byte words from src+from to the stack at to.
func copyWords(src bpf.Reg, from, to int16, n int) bpf.Program {
	var out bpf.Program
	for i := int16(0); i < int16(n); i++ {
		out = append(out,
			bpf.Load(bpf.R7, src, from+4*i, bpf.Word),
			bpf.Store(bpf.RFP, to+4*i, bpf.R7, bpf.Word))
	}
	return out
}

// program is hook h's instructions, reading svc and writing rev (forward)
// or reading rev (reverse). Every program returns 1: it never refuses a
// socket call, it only rewrites an address.
//
// Forward (connect, sendmsg): key = {netns cookie, destination, port,
// protocol}; when svc has it, rev[{socket cookie, target}] = the
// destination the client used, and the destination becomes the target.
// Reverse (recvmsg, getpeername): when rev has {socket cookie, peer},
// the peer becomes the address the client used.
func program(h Hook, svc, rev int) bpf.Program {
	// the key: {cookie, address, port, protocol or zero}
	cookie, table := bpf.FnGetSocketCookie, rev
	last := bpf.Program{bpf.StoreImm(bpf.RFP, stKey+28, 0, bpf.Word)}
	if h.Forward {
		cookie, table = bpf.FnGetNetnsCookie, svc
		last = bpf.Program{
			bpf.Load(bpf.R7, bpf.R6, ctxProtocol, bpf.Word),
			bpf.Store(bpf.RFP, stKey+28, bpf.R7, bpf.Word)}
	}
	insns := bpf.Program{
		bpf.Mov(bpf.R6, bpf.R1),
		bpf.Call(cookie),
		bpf.Store(bpf.RFP, stKey, bpf.R0, bpf.DWord)}
	insns = append(insns, loadAddr(h.V6, stKey+8)...)
	insns = append(insns,
		bpf.Load(bpf.R7, bpf.R6, ctxUserPort, bpf.Word),
		bpf.Store(bpf.RFP, stKey+24, bpf.R7, bpf.Word))
	insns = append(insns, last...)
	insns = append(insns,
		bpf.LoadMap(bpf.R1, table),
		bpf.Mov(bpf.R2, bpf.RFP),
		bpf.AddImm(bpf.R2, stKey),
		bpf.Call(bpf.FnMapLookupElem),
		bpf.JEqImm(bpf.R0, 0, "out"),
		bpf.Mov(bpf.R8, bpf.R0))
	if h.Forward {
		// the reverse entry: {socket cookie, target} → what was dialled
		insns = append(insns,
			bpf.Mov(bpf.R1, bpf.R6),
			bpf.Call(bpf.FnGetSocketCookie),
			bpf.Store(bpf.RFP, stRevKey, bpf.R0, bpf.DWord))
		insns = append(insns, copyWords(bpf.R8, 0, stRevKey+8, 5)...)          // target address, port
		insns = append(insns, bpf.StoreImm(bpf.RFP, stRevKey+28, 0, bpf.Word)) // zero
		insns = append(insns, copyWords(bpf.RFP, stKey+8, stRevVal, 5)...)     // dialled address, port
		insns = append(insns,
			bpf.StoreImm(bpf.RFP, stRevVal+20, 0, bpf.Word),
			bpf.LoadMap(bpf.R1, rev),
			bpf.Mov(bpf.R2, bpf.RFP),
			bpf.AddImm(bpf.R2, stRevKey),
			bpf.Mov(bpf.R3, bpf.RFP),
			bpf.AddImm(bpf.R3, stRevVal),
			bpf.MovImm(bpf.R4, 0), // BPF_ANY
			bpf.Call(bpf.FnMapUpdateElem))
	}
	insns = append(insns, storeAddr(h.V6)...)
	return append(insns,
		bpf.MovImm(bpf.R0, 1).WithLabel("out"),
		bpf.Exit())
}

// Version names this build's programs: a hash of all eight as the
// kernel reads them. A link whose program carries another version was
// attached by another build and is updated in place. Computed when first
// asked (the socket path runs), not at every start of the plugin.
var Version = sync.OnceValue(func() string {
	h := sha256.New()
	for _, hk := range Hooks {
		code, err := program(hk, 0, 0).Encode()
		if err != nil {
			panic(fmt.Sprintf("socket path: program %s: %v", hk.Name, err)) // a fault of this file
		}
		fmt.Fprintf(h, "%s\n%x\n", hk.Name, code)
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
})

// progName is hook h's program name: at most 15 characters, carrying
// the version ("pm_c4_1a2b3c4d").
func progName(h Hook, version string) string {
	short := map[string]string{"connect": "c", "sendmsg": "s", "recvmsg": "r", "getpeername": "p"}
	base := h.Name[:len(h.Name)-1]
	return "pm_" + short[base] + h.Name[len(h.Name)-1:] + "_" + version
}

// spec is hook h's program for maps svc and rev.
func spec(h Hook, svc, rev *bpf.Map, version string) bpf.ProgramSpec {
	return bpf.ProgramSpec{
		Name:       progName(h, version),
		Type:       bpf.CGroupSockAddr,
		AttachType: h.Attach,
		Insns:      program(h, svc.FD(), rev.FD()),
		License:    "Apache-2.0",
	}
}
