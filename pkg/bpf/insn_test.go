package bpf

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/cilium/ebpf/asm"
)

// TestEncode holds each instruction's encoding against cilium/ebpf's
// assembler, the one the socket path's programs were written with
// before this package (a test dependency only).
func TestEncode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ours   Program
		theirs asm.Instructions
	}{
		{"mov", Program{Mov(R6, R1)}, asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}},
		{"mov imm", Program{MovImm(R0, 1), MovImm(R4, -7)}, asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Mov.Imm(asm.R4, -7)}},
		{"add imm", Program{AddImm(R2, -32)}, asm.Instructions{asm.Add.Imm(asm.R2, -32)}},
		{"load word", Program{Load(R7, R6, 24, Word)}, asm.Instructions{asm.LoadMem(asm.R7, asm.R6, 24, asm.Word)}},
		{"store word", Program{Store(RFP, -56, R7, Word)}, asm.Instructions{asm.StoreMem(asm.RFP, -56, asm.R7, asm.Word)}},
		{"store dword", Program{Store(RFP, -32, R0, DWord)}, asm.Instructions{asm.StoreMem(asm.RFP, -32, asm.R0, asm.DWord)}},
		{"store imm", Program{StoreImm(RFP, -24, 0xffff0000, Word), StoreImm(RFP, -4, 0, Word)},
			asm.Instructions{asm.StoreImm(asm.RFP, -24, 0xffff0000, asm.Word), asm.StoreImm(asm.RFP, -4, 0, asm.Word)}},
		{"map", Program{LoadMap(R1, 9)}, asm.Instructions{asm.LoadMapPtr(asm.R1, 9)}},
		{"calls", Program{Call(FnMapLookupElem), Call(FnMapUpdateElem), Call(FnGetSocketCookie), Call(FnGetNetnsCookie)},
			asm.Instructions{asm.FnMapLookupElem.Call(), asm.FnMapUpdateElem.Call(), asm.FnGetSocketCookie.Call(), asm.FnGetNetnsCookie.Call()}},
		{"exit", Program{Exit()}, asm.Instructions{asm.Return()}},
		{"jump over a map load", Program{
			JEqImm(R0, 0, "out"), LoadMap(R1, 3), Mov(R8, R0), MovImm(R0, 1).WithLabel("out"), Exit()},
			asm.Instructions{
				asm.JEq.Imm(asm.R0, 0, "out"), asm.LoadMapPtr(asm.R1, 3), asm.Mov.Reg(asm.R8, asm.R0), asm.Mov.Imm(asm.R0, 1).WithSymbol("out"), asm.Return()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.ours.Encode()
			if err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			if err := tc.theirs.Marshal(&want, binary.LittleEndian); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Bytes()) {
				t.Errorf("encoded\n%x\nwant (cilium/ebpf)\n%x", got, want.Bytes())
			}
		})
	}
}

func TestEncodeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Program
		want string
	}{
		{"no target", Program{JEqImm(R0, 0, "nowhere"), Exit()}, `no instruction labelled "nowhere"`},
		{"label twice", Program{Exit().WithLabel("a"), Exit().WithLabel("a")}, `label "a" twice`},
	} {
		if _, err := tc.p.Encode(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestConstants(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ours, want uint64
	}{
		{"lookup", uint64(FnMapLookupElem), uint64(asm.FnMapLookupElem)},
		{"update", uint64(FnMapUpdateElem), uint64(asm.FnMapUpdateElem)},
		{"socket cookie", uint64(FnGetSocketCookie), uint64(asm.FnGetSocketCookie)},
		{"netns cookie", uint64(FnGetNetnsCookie), uint64(asm.FnGetNetnsCookie)},
	} {
		if tc.ours != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, tc.ours, tc.want)
		}
	}
}

func TestVerifierTail(t *testing.T) {
	log := make([]byte, 64)
	copy(log, "0: r0 = 1\n1: exit\nR0 !read_ok\n")
	if got, want := verifierTail(log), ": verifier: 0: r0 = 1; 1: exit; R0 !read_ok"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if got := verifierTail(make([]byte, 8)); got != "" {
		t.Errorf("an empty log: %q", got)
	}
}
