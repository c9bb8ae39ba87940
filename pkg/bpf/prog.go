package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// CGroupSockAddr is the program type of the cgroup socket-address hooks.
const CGroupSockAddr uint32 = unix.BPF_PROG_TYPE_CGROUP_SOCK_ADDR

// The hooks' attach types (enum bpf_attach_type).
const (
	AttachInet4Connect     uint32 = unix.BPF_CGROUP_INET4_CONNECT
	AttachInet6Connect     uint32 = unix.BPF_CGROUP_INET6_CONNECT
	AttachUDP4Sendmsg      uint32 = unix.BPF_CGROUP_UDP4_SENDMSG
	AttachUDP6Sendmsg      uint32 = unix.BPF_CGROUP_UDP6_SENDMSG
	AttachUDP4Recvmsg      uint32 = unix.BPF_CGROUP_UDP4_RECVMSG
	AttachUDP6Recvmsg      uint32 = unix.BPF_CGROUP_UDP6_RECVMSG
	AttachInet4GetPeername uint32 = unix.BPF_CGROUP_INET4_GETPEERNAME
	AttachInet6GetPeername uint32 = unix.BPF_CGROUP_INET6_GETPEERNAME
)

// ProgramSpec is a program to load.
type ProgramSpec struct {
	Name       string // at most 15 bytes of [A-Za-z0-9_.]
	Type       uint32
	AttachType uint32
	License    string
	Insns      Program
}

// Prog is a loaded program.
type Prog struct{ object }

type progLoadAttr struct {
	ProgType           uint32
	InsnCnt            uint32
	Insns              pointer
	License            pointer
	LogLevel           uint32
	LogSize            uint32
	LogBuf             pointer
	KernVersion        uint32
	ProgFlags          uint32
	ProgName           [unix.BPF_OBJ_NAME_LEN]byte
	ProgIfindex        uint32
	ExpectedAttachType uint32
}

// NewProgram loads a program. When the verifier refuses it, the load is
// repeated with its log, and the error ends with the log's last lines.
func NewProgram(s ProgramSpec) (*Prog, error) {
	code, err := s.Insns.Encode()
	if err != nil {
		return nil, err
	}
	lic, err := unix.BytePtrFromString(s.License)
	if err != nil {
		return nil, err
	}
	attr := progLoadAttr{ProgType: s.Type, InsnCnt: uint32(len(code) / 8), Insns: bytesPtr(code),
		License: ptr(lic), ProgName: objName(s.Name), ExpectedAttachType: s.AttachType}
	fd, err := loadRetrying(&attr)
	if err == nil {
		runtime.KeepAlive(code)
		runtime.KeepAlive(lic)
		return &Prog{object{fd}}, nil
	}
	if errors.Is(err, unix.EPERM) {
		return nil, fmt.Errorf("load program %s: %w", s.Name, err)
	}
	log := make([]byte, 64<<10)
	attr.LogLevel, attr.LogSize, attr.LogBuf = 1, uint32(len(log)), bytesPtr(log)
	if fd, err2 := loadRetrying(&attr); err2 == nil { // refused once, not twice
		unix.Close(fd)
	}
	runtime.KeepAlive(code)
	runtime.KeepAlive(lic)
	runtime.KeepAlive(log)
	return nil, fmt.Errorf("load program %s: %w%s", s.Name, err, verifierTail(log))
}

// loadRetrying loads a program again while the verifier is interrupted
// (EAGAIN), a few times.
func loadRetrying(attr *progLoadAttr) (int, error) {
	for i := 0; ; i++ {
		fd, err := lockedMemory(func() (int, error) { return bpf(unix.BPF_PROG_LOAD, attr) })
		if errors.Is(err, unix.EAGAIN) && i < 5 {
			continue
		}
		return fd, err
	}
}

// verifierTail is the last lines of a verifier log, or "".
func verifierTail(log []byte) string {
	s := strings.TrimRight(string(log[:max(0, bytes.IndexByte(append(log, 0), 0))]), "\n")
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return ": verifier: " + strings.Join(lines, "; ")
}

type idAttr struct {
	ID        uint32
	NextID    uint32
	OpenFlags uint32
}

// ProgramFromID opens the loaded program of id.
func ProgramFromID(id uint32) (*Prog, error) {
	attr := idAttr{ID: id}
	fd, err := bpf(unix.BPF_PROG_GET_FD_BY_ID, &attr)
	if err != nil {
		return nil, fmt.Errorf("program id %d: %w", id, err)
	}
	return &Prog{object{fd}}, nil
}

// Name is the program's name as loaded.
func (p *Prog) Name() (string, error) {
	var b [80]byte // struct bpf_prog_info up to its name
	if err := p.info(b[:]); err != nil {
		return "", fmt.Errorf("program info: %w", err)
	}
	return cString(b[64:80]), nil
}

// HaveProgramHelper reports (nil) whether this kernel loads, for this
// process, a program of type typ (attached as attach) calling helper fn.
func HaveProgramHelper(typ, attach uint32, fn int32) error {
	p, err := NewProgram(ProgramSpec{Name: "pm_probe", Type: typ, AttachType: attach, License: "Apache-2.0",
		Insns: Program{Call(fn), MovImm(R0, 1), Exit()}})
	if err != nil {
		return err
	}
	return p.Close()
}

// Link is a program's attachment, as a file descriptor.
type Link struct{ object }

// LinkInfo is what the kernel says of a link.
type LinkInfo struct {
	Type     uint32
	ProgID   uint32
	CgroupID uint64 // a cgroup link's cgroup
}

// LinkCgroup is a link's type when it attaches a program to a cgroup.
const LinkCgroup uint32 = unix.BPF_LINK_TYPE_CGROUP

type linkCreateAttr struct {
	ProgFD     uint32
	TargetFD   uint32
	AttachType uint32
	Flags      uint32
}

// AttachCgroup attaches p to the cgroup open as cgroupFD.
func AttachCgroup(cgroupFD int, p *Prog, attach uint32) (*Link, error) {
	attr := linkCreateAttr{ProgFD: uint32(p.fd), TargetFD: uint32(cgroupFD), AttachType: attach}
	fd, err := bpf(unix.BPF_LINK_CREATE, &attr)
	if err != nil {
		return nil, fmt.Errorf("attach to the cgroup: %w", err)
	}
	return &Link{object{fd}}, nil
}

// LoadPinnedLink opens the link pinned at path.
func LoadPinnedLink(path string) (*Link, error) {
	fd, err := objGet(path)
	if err != nil {
		return nil, err
	}
	return &Link{object{fd}}, nil
}

// Info reads the link's type, program and cgroup.
func (l *Link) Info() (LinkInfo, error) {
	var b [32]byte // struct bpf_link_info up to its cgroup member
	if err := l.info(b[:]); err != nil {
		return LinkInfo{}, fmt.Errorf("link info: %w", err)
	}
	le := binary.LittleEndian
	in := LinkInfo{Type: le.Uint32(b[0:]), ProgID: le.Uint32(b[8:])}
	if in.Type == LinkCgroup {
		in.CgroupID = le.Uint64(b[16:])
	}
	return in, nil
}

type linkUpdateAttr struct {
	LinkFD    uint32
	NewProgFD uint32
	Flags     uint32
	OldProgFD uint32
}

// Update puts p in the link's place of its program: the attachment
// stays, so no call goes through without a program.
func (l *Link) Update(p *Prog) error {
	attr := linkUpdateAttr{LinkFD: uint32(l.fd), NewProgFD: uint32(p.fd)}
	if _, err := bpf(unix.BPF_LINK_UPDATE, &attr); err != nil {
		return fmt.Errorf("update link: %w", err)
	}
	return nil
}

// Detach detaches the link's program now, while the link lives on
// (Linux 5.9; before it, EINVAL).
func (l *Link) Detach() error {
	attr := struct{ LinkFD uint32 }{uint32(l.fd)}
	if _, err := bpf(unix.BPF_LINK_DETACH, &attr); err != nil {
		return fmt.Errorf("detach link: %w", err)
	}
	return nil
}
