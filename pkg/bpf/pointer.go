package bpf

// pointer is a pointer field of bpf_attr (__aligned_u64) that holds a Go
// pointer, not its address as an integer: a goroutine's stack moves when
// it grows, and the runtime then updates the pointers it knows of — an
// address kept as an integer would still name the old stack when the
// syscall runs. Eight bytes wherever the kernel reads them (pointer_*.go:
// on a 32-bit target the pointer is the half the kernel reads as the
// value's low bits). cilium/ebpf's sys.Pointer is the same.
