//go:build 386 || arm || mipsle

package bpf

import "unsafe"

type pointer struct {
	p unsafe.Pointer
	_ uint32
}
