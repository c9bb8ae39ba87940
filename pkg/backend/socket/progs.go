package socket

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
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
	Attach ebpf.AttachType
	// Forward hooks rewrite a destination (connect, sendmsg); the others
	// rewrite it back (recvmsg, getpeername).
	Forward bool
	V6      bool
}

// Hooks are the eight hooks, both families: an IPv6 socket dialling
// ::ffff:127.0.0.1 goes through connect6 to the IPv4 entry.
var Hooks = []Hook{
	{"connect4", ebpf.AttachCGroupInet4Connect, true, false},
	{"connect6", ebpf.AttachCGroupInet6Connect, true, true},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, true, false},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, true, true},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, false, false},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, false, true},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, false, false},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, false, true},
}

// word is one 4-byte write to the stack at off: the instructions that
// load the value (into r7, a scratch register) and store it.
type word struct {
	off   int16
	insns asm.Instructions
}

// stackWords emits independent word writes with, in every 8-byte stack
// slot, the one at the slot's start last. A 4-byte store of a register
// there is a spill the verifier tracks, and before Linux 6.6 it refuses
// a later narrower write into that slot ("attempt to corrupt spilled
// pointer on stack") unless the loader has CAP_PERFMON: with CAP_BPF
// alone, on Debian 12's 6.1, it did. The writes must not read what the
// others write.
func stackWords(ws ...word) asm.Instructions {
	var out asm.Instructions
	for _, atStart := range []bool{false, true} {
		for _, w := range ws {
			if (w.off%8 == 0) == atStart {
				out = append(out, w.insns...)
			}
		}
	}
	return out
}

// imm writes v at off.
func imm(off int16, v int32) word {
	return word{off, asm.Instructions{asm.StoreImm(asm.RFP, off, int64(v), asm.Word)}}
}

// load writes the word at src+from to off.
func load(src asm.Register, from, off int16) word {
	return word{off, asm.Instructions{asm.LoadMem(asm.R7, src, from, asm.Word), asm.StoreMem(asm.RFP, off, asm.R7, asm.Word)}}
}

// addrWords copy the socket address of ctx (r6) into the 16 bytes at
// stack offset off, IPv4 as ::ffff:a.b.c.d.
func addrWords(v6 bool, off int16) []word {
	if v6 {
		var out []word
		for i := int16(0); i < 4; i++ {
			out = append(out, load(asm.R6, ctxUserIP6+4*i, off+4*i))
		}
		return out
	}
	return []word{imm(off, 0), imm(off+4, 0), imm(off+8, -0x10000), // 00 00 ff ff
		load(asm.R6, ctxUserIP4, off+12)}
}

// storeAddr writes the address and port at r8 (a map value: address,
// then port) into ctx: the destination (forward hooks) or the peer
// (reverse hooks) the socket sees.
func storeAddr(v6 bool) asm.Instructions {
	var out asm.Instructions
	if v6 {
		for i := int16(0); i < 4; i++ {
			out = append(out,
				asm.LoadMem(asm.R7, asm.R8, 4*i, asm.Word),
				asm.StoreMem(asm.R6, ctxUserIP6+4*i, asm.R7, asm.Word))
		}
	} else {
		out = append(out,
			asm.LoadMem(asm.R7, asm.R8, 12, asm.Word),
			asm.StoreMem(asm.R6, ctxUserIP4, asm.R7, asm.Word))
	}
	return append(out,
		asm.LoadMem(asm.R7, asm.R8, 16, asm.Word),
		asm.StoreMem(asm.R6, ctxUserPort, asm.R7, asm.Word))
}

// copyWords copy n 4-byte words from src+from to the stack at to.
func copyWords(src asm.Register, from, to int16, n int) []word {
	var out []word
	for i := int16(0); i < int16(n); i++ {
		out = append(out, load(src, from+4*i, to+4*i))
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
func program(h Hook, svc, rev int) asm.Instructions {
	// the key: {cookie, address, port, protocol or zero}
	cookie, table := asm.FnGetSocketCookie, rev
	last := imm(stKey+28, 0)
	if h.Forward {
		cookie, table = asm.FnGetNetnsCookie, svc
		last = load(asm.R6, ctxProtocol, stKey+28)
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		cookie.Call(),
		asm.StoreMem(asm.RFP, stKey, asm.R0, asm.DWord)}
	key := append(addrWords(h.V6, stKey+8), load(asm.R6, ctxUserPort, stKey+24), last)
	insns = append(insns, stackWords(key...)...)
	insns = append(insns,
		asm.LoadMapPtr(asm.R1, table),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Reg(asm.R8, asm.R0))
	if h.Forward {
		// the reverse entry: {socket cookie, target} → what was dialled
		insns = append(insns,
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.FnGetSocketCookie.Call(),
			asm.StoreMem(asm.RFP, stRevKey, asm.R0, asm.DWord))
		insns = append(insns, stackWords(append(copyWords(asm.R8, 0, stRevKey+8, 5), imm(stRevKey+28, 0))...)...)      // target address, port, zero
		insns = append(insns, stackWords(append(copyWords(asm.RFP, stKey+8, stRevVal, 5), imm(stRevVal+20, 0))...)...) // dialled address, port, zero
		insns = append(insns,
			asm.LoadMapPtr(asm.R1, rev),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, stRevKey),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, stRevVal),
			asm.Mov.Imm(asm.R4, 0), // BPF_ANY
			asm.FnMapUpdateElem.Call())
	}
	insns = append(insns, storeAddr(h.V6)...)
	return append(insns,
		asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
		asm.Return())
}

// Version names this build's programs: a hash of all eight as the
// kernel reads them. A link whose program carries another version was
// attached by another build and is updated in place. Computed when first
// asked (the socket path runs), not at every start of the plugin.
var Version = sync.OnceValue(func() string {
	h := sha256.New()
	for _, hk := range Hooks {
		var code bytes.Buffer
		if err := program(hk, 0, 0).Marshal(&code, binary.LittleEndian); err != nil {
			panic(fmt.Sprintf("socket path: program %s: %v", hk.Name, err)) // a fault of this file
		}
		fmt.Fprintf(h, "%s\n%x\n", hk.Name, code.Bytes())
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
})

// Revision orders the programs' behaviours: a build whose programs do
// what the last revision's did not bumps it (TestProgramRevision holds
// Version to it). During a rolling update the plugin and the agent of two
// builds meet: a build updates the programs of an older revision, and
// leaves a newer revision's, so neither rewrites the other's on every ADD
// and pass; builds of one revision run the same programs.
const Revision = 1

// progName is hook h's program name: at most 15 characters, carrying the
// revision and the first six digits of the version ("pm_c4_01_1a2b3c").
func progName(h Hook, revision int, version string) string {
	short := map[string]string{"connect": "c", "sendmsg": "s", "recvmsg": "r", "getpeername": "p"}
	base := h.Name[:len(h.Name)-1]
	return fmt.Sprintf("pm_%s%s_%02d_%.6s", short[base], h.Name[len(h.Name)-1:], revision, version)
}

// revisionOf reads the revision from a program's name; false for a name
// progName did not make.
func revisionOf(name string) (int, bool) {
	parts := strings.Split(name, "_")
	if len(parts) != 4 || parts[0] != "pm" || len(parts[2]) != 2 {
		return 0, false
	}
	r, err := strconv.Atoi(parts[2])
	return r, err == nil
}

// spec is hook h's program for maps svc and rev.
func spec(h Hook, svc, rev *ebpf.Map, revision int, version string) *ebpf.ProgramSpec {
	return &ebpf.ProgramSpec{
		Name:         progName(h, revision, version),
		Type:         ebpf.CGroupSockAddr,
		AttachType:   h.Attach,
		Instructions: program(h, svc.FD(), rev.FD()),
		License:      "Apache-2.0",
	}
}
