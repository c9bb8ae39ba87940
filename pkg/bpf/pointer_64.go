//go:build !(386 || arm || mipsle || mips)

package bpf

import "unsafe"

type pointer struct{ p unsafe.Pointer }
