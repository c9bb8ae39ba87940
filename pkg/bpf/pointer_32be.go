//go:build mips

package bpf

import "unsafe"

type pointer struct {
	_ uint32
	p unsafe.Pointer
}
