package socket

import (
	"testing"

	"github.com/cilium/ebpf/asm"
)

// The stack rule of the verifiers before Linux 6.6 for a loader without
// CAP_PERFMON (the DaemonSet's agent has CAP_BPF alone): once a register
// was stored at the start of an 8-byte slot (a spill the verifier
// tracks), a narrower write into that slot is refused. Every program
// writes its slots in an order those kernels take; the real 6.1 verifier
// judges them in the guest suite (TestSocketPathCapabilities).
func TestProgramsSpillLast(t *testing.T) {
	for _, h := range Hooks {
		spilled := map[int16]bool{} // slot (8-aligned offset) -> a register stored at its start
		for i, ins := range program(h, 0, 0) {
			if c := ins.OpCode.Class(); c != asm.StClass && c != asm.StXClass || ins.Dst != asm.RFP {
				continue
			}
			slot := ins.Offset &^ 7 // floor to 8 (two's complement)
			if spilled[slot] && ins.OpCode.Size() != asm.DWord {
				t.Errorf("%s: instruction %d (%v) writes into slot %d after a register was stored at its start", h.Name, i, ins, slot)
			}
			if ins.OpCode.Class() == asm.StXClass && ins.Offset%8 == 0 && ins.Src != asm.R0 {
				spilled[slot] = true
			}
		}
		if len(spilled) == 0 {
			t.Errorf("%s: no register stored at a slot's start: the check above saw nothing", h.Name)
		}
	}
}
