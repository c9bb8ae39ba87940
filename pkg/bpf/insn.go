// Package bpf is the little of the kernel's BPF interface the socket path
// uses: a few instructions, hash maps, cgroup socket-address programs and
// their links, pinned in a bpf filesystem. It speaks bpf(2) directly
// through golang.org/x/sys/unix: a general library (with BTF, ELF
// loading and every program type) would weigh more in the plugin than
// everything else it links.
package bpf

import (
	"encoding/binary"
	"fmt"
)

// Reg is a register: R0 the return value, R1–R5 the arguments, R6–R9
// kept across calls, RFP the frame pointer.
type Reg uint8

const (
	R0 Reg = iota
	R1
	R2
	R3
	R4
	R5
	R6
	R7
	R8
	R9
	RFP
)

// Size is the width of a memory access.
type Size uint8

const (
	Word  Size = 0x00 // BPF_W, 4 bytes
	DWord Size = 0x18 // BPF_DW, 8 bytes
)

// Helper functions the programs call (enum bpf_func_id).
const (
	FnMapLookupElem   int32 = 1
	FnMapUpdateElem   int32 = 2
	FnGetSocketCookie int32 = 46
	FnGetNetnsCookie  int32 = 122
)

// Opcodes (include/uapi/linux/bpf_common.h, bpf.h).
const (
	opMovReg    = 0xbf // BPF_ALU64 | BPF_MOV | BPF_X
	opMovImm    = 0xb7 // BPF_ALU64 | BPF_MOV | BPF_K
	opAddImm    = 0x07 // BPF_ALU64 | BPF_ADD | BPF_K
	opLdx       = 0x61 // BPF_LDX | BPF_MEM, | size
	opStx       = 0x63 // BPF_STX | BPF_MEM, | size
	opSt        = 0x62 // BPF_ST | BPF_MEM, | size
	opLdImm64   = 0x18 // BPF_LD | BPF_IMM | BPF_DW: two slots
	opCall      = 0x85 // BPF_JMP | BPF_CALL
	opJEqImm    = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	opExit      = 0x95 // BPF_JMP | BPF_EXIT
	pseudoMapFD = 1    // BPF_PSEUDO_MAP_FD: the immediate is a map's fd
)

// Insn is one instruction; a jump names its target by label.
type Insn struct {
	Op     uint8
	Dst    Reg
	Src    Reg
	Off    int16
	Imm    int64
	Label  string // this instruction's label
	Target string // a jump's label
}

// Mov copies src into dst.
func Mov(dst, src Reg) Insn { return Insn{Op: opMovReg, Dst: dst, Src: src} }

// MovImm sets dst to imm.
func MovImm(dst Reg, imm int32) Insn { return Insn{Op: opMovImm, Dst: dst, Imm: int64(imm)} }

// AddImm adds imm to dst.
func AddImm(dst Reg, imm int32) Insn { return Insn{Op: opAddImm, Dst: dst, Imm: int64(imm)} }

// Load reads size bytes at src+off into dst.
func Load(dst, src Reg, off int16, size Size) Insn {
	return Insn{Op: opLdx | uint8(size), Dst: dst, Src: src, Off: off}
}

// Store writes size bytes of src at dst+off.
func Store(dst Reg, off int16, src Reg, size Size) Insn {
	return Insn{Op: opStx | uint8(size), Dst: dst, Src: src, Off: off}
}

// StoreImm writes imm, size bytes wide, at dst+off (the kernel takes
// its low 32 bits, sign-extended for DWord).
func StoreImm(dst Reg, off int16, imm int64, size Size) Insn {
	return Insn{Op: opSt | uint8(size), Dst: dst, Off: off, Imm: imm}
}

// LoadMap sets dst to the map of file descriptor fd.
func LoadMap(dst Reg, fd int) Insn {
	return Insn{Op: opLdImm64, Dst: dst, Src: pseudoMapFD, Imm: int64(fd)}
}

// Call calls helper fn: arguments in R1–R5, the result in R0.
func Call(fn int32) Insn { return Insn{Op: opCall, Imm: int64(fn)} }

// JEqImm jumps to the instruction labelled target when dst is imm.
func JEqImm(dst Reg, imm int32, target string) Insn {
	return Insn{Op: opJEqImm, Dst: dst, Imm: int64(imm), Target: target}
}

// Exit returns R0.
func Exit() Insn { return Insn{Op: opExit} }

// WithLabel labels i, for a jump to it.
func (i Insn) WithLabel(l string) Insn { i.Label = l; return i }

func (i Insn) slots() int {
	if i.Op == opLdImm64 {
		return 2
	}
	return 1
}

// Program is a program's instructions.
type Program []Insn

// Encode is p as the kernel reads it: 8 bytes a slot, little-endian (the
// byte order of the machines the plugin is built for), jumps resolved.
func (p Program) Encode() ([]byte, error) {
	at := map[string]int{}
	n := 0
	for _, i := range p {
		if i.Label != "" {
			if _, dup := at[i.Label]; dup {
				return nil, fmt.Errorf("bpf: label %q twice", i.Label)
			}
			at[i.Label] = n
		}
		n += i.slots()
	}
	out := make([]byte, 0, 8*n)
	slot := 0
	for _, i := range p {
		off := i.Off
		if i.Target != "" {
			to, ok := at[i.Target]
			if !ok {
				return nil, fmt.Errorf("bpf: no instruction labelled %q", i.Target)
			}
			off = int16(to - slot - 1)
		}
		out = append(out, i.Op, uint8(i.Dst)&0x0f|uint8(i.Src)<<4)
		out = binary.LittleEndian.AppendUint16(out, uint16(off))
		out = binary.LittleEndian.AppendUint32(out, uint32(i.Imm))
		if i.Op == opLdImm64 {
			out = append(out, 0, 0, 0, 0)
			out = binary.LittleEndian.AppendUint32(out, uint32(uint64(i.Imm)>>32))
		}
		slot += i.slots()
	}
	return out, nil
}
