package bpf

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrKeyNotExist is a map operation's answer for a key the map does not
// hold, or for the end of an iteration.
var ErrKeyNotExist = errors.New("key does not exist")

// bpf calls bpf(2) with attr, a struct laid out as the kernel's union
// bpf_attr member for cmd; the kernel takes the part it is given and
// reads the rest as zero.
func bpf[A any](cmd uintptr, attr *A) (int, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_BPF, cmd, uintptr(unsafe.Pointer(attr)), unsafe.Sizeof(*attr))
		runtime.KeepAlive(attr)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return -1, errno
		}
		return int(r), nil
	}
}

// lockedMemory runs create, a map's or program's creation, and where the
// kernel refuses it with EPERM while RLIMIT_MEMLOCK is finite runs it
// again once with the limit lifted: to no limit, or without
// CAP_SYS_RESOURCE to the hard limit. Kernels before 5.11 charge a map's
// and a program's memory to the creator's RLIMIT_MEMLOCK (often 64 KiB,
// or 8 MiB under systemd) and say EPERM when it is spent; from 5.11 the
// memory cgroup counts it and the limit plays no part. cilium/ebpf's
// rlimit.RemoveMemlock lifts it the same way, ahead of time. Without
// CAP_BPF the second try fails as the first.
func lockedMemory(create func() (int, error)) (int, error) {
	fd, err := create()
	if !errors.Is(err, unix.EPERM) {
		return fd, err
	}
	var cur unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &cur) != nil {
		return fd, err
	}
	for _, lim := range []unix.Rlimit{{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}, {Cur: cur.Max, Max: cur.Max}} {
		if cur.Cur != unix.RLIM_INFINITY && (lim.Cur == unix.RLIM_INFINITY || lim.Cur > cur.Cur) && unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil {
			return create()
		}
	}
	return fd, err
}

// ptr is p as a bpf_attr pointer field; the caller keeps p alive.
func ptr[T any](p *T) pointer { return pointer{p: unsafe.Pointer(p)} }

// bytesPtr is the first byte of b, or nil for none.
func bytesPtr(b []byte) pointer {
	if len(b) == 0 {
		return pointer{}
	}
	return ptr(&b[0])
}

// object is an fd of a map, program or link.
type object struct{ fd int }

// FD is the object's file descriptor.
func (o *object) FD() int { return o.fd }

// Close releases the file descriptor; the object lives on while another
// holds it (a pin, an attachment, a program using a map).
func (o *object) Close() error {
	if o == nil || o.fd < 0 {
		return nil
	}
	err := unix.Close(o.fd)
	o.fd = -1
	return err
}

type objAttr struct {
	Pathname  pointer
	BpfFD     uint32
	FileFlags uint32
}

// Pin pins the object at path, on a bpf filesystem.
func (o *object) Pin(path string) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	attr := objAttr{Pathname: ptr(p), BpfFD: uint32(o.fd)}
	_, err = bpf(unix.BPF_OBJ_PIN, &attr)
	runtime.KeepAlive(p)
	if err != nil {
		return fmt.Errorf("pin %s: %w", path, err)
	}
	return nil
}

// objGet opens the object pinned at path (ENOENT: os.ErrNotExist).
func objGet(path string) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	attr := objAttr{Pathname: ptr(p)}
	fd, err := bpf(unix.BPF_OBJ_GET, &attr)
	runtime.KeepAlive(p)
	if err != nil {
		return -1, fmt.Errorf("open pinned %s: %w", path, err)
	}
	return fd, nil
}

type infoAttr struct {
	BpfFD   uint32
	InfoLen uint32
	Info    pointer
}

// info fills buf with the object's bpf_*_info: as much of it as buf
// holds (it is zero, so the kernel fills no arrays).
func (o *object) info(buf []byte) error {
	attr := infoAttr{BpfFD: uint32(o.fd), InfoLen: uint32(len(buf)), Info: bytesPtr(buf)}
	_, err := bpf(unix.BPF_OBJ_GET_INFO_BY_FD, &attr)
	runtime.KeepAlive(buf)
	return err
}

// cString is a NUL-padded name field.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// objName is name as an object name field: at most 15 bytes and a NUL.
func objName(name string) (out [unix.BPF_OBJ_NAME_LEN]byte) {
	copy(out[:unix.BPF_OBJ_NAME_LEN-1], name)
	return out
}
