package nettest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// CgroupSite is where a test's socket-path programs live: a child cgroup
// the test made in the cgroup v2 hierarchy (mounted by the test in a
// temporary directory of its private mount namespace) and a bpf
// filesystem mounted for the test alone. Only client processes the test
// starts run in the cgroup, started there (CLONE_INTO_CGROUP): no
// existing process is moved. Everything goes when the test ends: the
// bpffs is unmounted (its pinned links with it, which detaches the
// programs), the cgroup removed, the cgroup2 mount unmounted.
type CgroupSite struct {
	// Cgroup is the child cgroup ("cgroupPath").
	Cgroup string
	// PinDir is a directory on the test's bpffs ("bpfPinDir").
	PinDir string
	// BPFFS is the test's bpffs mount point.
	BPFFS string
}

// NewCgroupSite makes the test's cgroup and bpffs.
func NewCgroupSite(tb TB) *CgroupSite {
	tb.Helper()
	if !Isolated() {
		tb.Fatalf("cgroup sites are made only in the isolated mount namespace of nettest.Main")
	}
	root := tb.TempDir()
	cg2 := filepath.Join(root, "cgroup2")
	bpffs := filepath.Join(root, "bpffs")
	for _, d := range []string{cg2, bpffs} {
		if err := os.Mkdir(d, 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	if err := unix.Mount("cgroup2", cg2, "cgroup2", 0, ""); err != nil {
		tb.Fatalf("mount cgroup2 at %s: %v", cg2, err)
	}
	tb.Cleanup(func() { _ = unix.Unmount(cg2, unix.MNT_DETACH) })
	child := filepath.Join(cg2, fmt.Sprintf("portmap-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(child, 0o755); err != nil {
		tb.Fatalf("make test cgroup: %v", err)
	}
	tb.Cleanup(func() {
		// the test's clients have exited; retry briefly while the kernel
		// lets go of them
		for i := 0; i < 50; i++ {
			if err := os.Remove(child); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		tb.Errorf("remove test cgroup %s: still busy", child)
	})
	if err := unix.Mount("bpffs", bpffs, "bpf", 0, "mode=0700"); err != nil {
		tb.Fatalf("mount bpffs at %s: %v", bpffs, err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(bpffs, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount test bpffs: %v", err)
		}
	})
	return &CgroupSite{Cgroup: child, PinDir: filepath.Join(bpffs, "portmap"), BPFFS: bpffs}
}

// clientEnv makes a run of the test binary a socket client (RunClient).
const clientEnv = "PORTMAP_NETTEST_CLIENT"

// ClientResult is what a client saw: the server's reply line and the peer
// address the socket reported (getpeername for TCP, recvfrom's source for
// UDP).
type ClientResult struct {
	Reply, Peer string
}

// Client runs one client process in the test's cgroup: proto "tcp" or
// "udp" (unconnected: sendto and recvfrom) to addr. With otherNetns the
// process starts in a network namespace of its own, where a server on
// 127.0.0.1 and [::1] at addr's port answers "local".
func (s *CgroupSite) Client(proto, addr string, otherNetns bool) (ClientResult, error) {
	return s.Clients(proto, addr, otherNetns, 1)
}

// Clients is Client dialling n times in one process, one new connection
// each; it fails at the first dial that fails.
func (s *CgroupSite) Clients(proto, addr string, otherNetns bool, n int) (ClientResult, error) {
	mode := "node"
	if otherNetns {
		mode = "other"
	}
	out, err := s.run(exec.Command(os.Args[0]), strings.Join([]string{mode, proto, addr, fmt.Sprint(n)}, " "), otherNetns)
	if err != nil {
		return ClientResult{}, err
	}
	reply, peer, _ := strings.Cut(out, "|")
	return ClientResult{Reply: reply, Peer: peer}, nil
}

// RunClientIfAsked makes this run of the binary the client process a
// CgroupSite started, and exits; otherwise it returns. Main calls it; a
// program that uses a CgroupSite (the benchmark) calls it first thing.
func RunClientIfAsked() {
	if spec := os.Getenv(clientEnv); spec != "" {
		runClient(spec)
	}
}

// Rate runs one client process in the test's cgroup, in the node
// namespace, that opens up to n TCP connections to addr one after another
// (each: connect, read the server's line, close) for at most limit, and
// returns the completed connections per second.
func (s *CgroupSite) Rate(addr string, n int, limit time.Duration) (float64, error) {
	cmd := exec.Command(os.Args[0])
	// no preemption signals: they would interrupt the blocking calls
	cmd.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
	out, err := s.run(cmd, strings.Join([]string{"rate", "tcp", addr, fmt.Sprint(n), fmt.Sprint(int64(limit))}, " "), false)
	if err != nil {
		return 0, err
	}
	var done, ns int64
	if _, err := fmt.Sscan(out, &done, &ns); err != nil || ns <= 0 {
		return 0, fmt.Errorf("rate client printed %q", out)
	}
	return float64(done) / time.Duration(ns).Seconds(), nil
}

// run starts cmd in the test's cgroup (and with otherNetns in a network
// namespace of its own) as a client with spec and returns what it printed.
func (s *CgroupSite) run(cmd *exec.Cmd, spec string, otherNetns bool) (string, error) {
	var out []byte
	err := s.inCgroup(cmd, spec, otherNetns, func() error {
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("client %s: %s", spec, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// inCgroup sets cmd up as a client with spec that starts in the test's
// cgroup (CLONE_INTO_CGROUP; with otherNetns in a network namespace of
// its own) and calls start, which starts it.
func (s *CgroupSite) inCgroup(cmd *exec.Cmd, spec string, otherNetns bool, start func() error) error {
	cg, err := os.Open(s.Cgroup)
	if err != nil {
		return err
	}
	defer cg.Close()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, clientEnv+"="+spec)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	if otherNetns {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	return start()
}

// runClient is the client process: it prints "reply|peer" (or, in rate
// mode, "connections nanoseconds") or fails.
func runClient(spec string) {
	parts := strings.Fields(spec)
	if len(parts) == 2 && parts[0] == "udpconn" {
		if err := connectedUDP(parts[1]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(parts) == 5 && parts[0] == "rate" {
		n, _ := strconv.Atoi(parts[3])
		limit, _ := strconv.ParseInt(parts[4], 10, 64)
		done, elapsed, err := rateLoop(parts[2], n, time.Duration(limit))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%d %d\n", done, elapsed.Nanoseconds())
		os.Exit(0)
	}
	if len(parts) != 4 {
		fmt.Fprintf(os.Stderr, "bad client spec %q\n", spec)
		os.Exit(2)
	}
	mode, proto, addr := parts[0], parts[1], parts[2]
	n, _ := strconv.Atoi(parts[3])
	if mode == "other" {
		if err := serveLocal(proto, addr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	var res ClientResult
	for i := 0; i < max(n, 1); i++ {
		var err error
		if res, err = dialOnce(proto, addr); err != nil {
			fmt.Fprintf(os.Stderr, "dial %d of %d: %v\n", i+1, n, err)
			os.Exit(1)
		}
	}
	fmt.Printf("%s|%s\n", res.Reply, res.Peer)
	os.Exit(0)
}

// serveLocal brings lo up in the client's own namespace and answers
// "local" on addr's port at 127.0.0.1 and ::1.
func serveLocal(proto, addr string) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(addr)
	for _, host := range []string{"127.0.0.1", "::1"} {
		a := net.JoinHostPort(host, port)
		if proto == "udp" {
			pc, err := net.ListenPacket("udp", a)
			if err != nil {
				return err
			}
			go func() {
				buf := make([]byte, 1500)
				for {
					_, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo([]byte("local\n"), from)
				}
			}()
			continue
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			return err
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "local\n")
				c.Close()
			}
		}()
	}
	return nil
}

// dialOnce sends one request and reads the reply. TCP reports the peer
// from getpeername(); UDP sends from an unconnected socket (sendto) and
// reports the source recvfrom() gave.
func dialOnce(proto, addr string) (ClientResult, error) {
	deadline := time.Now().Add(Timeout)
	if proto == "udp" {
		raddr, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return ClientResult{}, err
		}
		network := "udp4"
		if raddr.IP.To4() == nil || strings.HasPrefix(addr, "[") {
			network = "udp6"
		}
		pc, err := net.ListenUDP(network, nil)
		if err != nil {
			return ClientResult{}, err
		}
		defer pc.Close()
		_ = pc.SetDeadline(deadline)
		if _, err := pc.WriteTo([]byte("hi\n"), raddr); err != nil {
			return ClientResult{}, err
		}
		buf := make([]byte, 1500)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return ClientResult{}, err
		}
		return ClientResult{Reply: strings.TrimSpace(string(buf[:n])), Peer: from.String()}, nil
	}
	if strings.HasPrefix(addr, "[::ffff:") {
		return dialMapped(addr)
	}
	c, err := net.DialTimeout("tcp", addr, Timeout)
	if err != nil {
		return ClientResult{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	var peer string
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return ClientResult{}, err
	}
	var perr error
	_ = raw.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, perr = unix.Getpeername(int(fd)); perr == nil {
			peer = sockaddrString(sa)
		}
	})
	if perr != nil {
		return ClientResult{}, fmt.Errorf("getpeername: %w", perr)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ClientResult{}, err
	}
	return ClientResult{Reply: strings.TrimSpace(line), Peer: peer}, nil
}

// dialMapped dials a v4-mapped address from an IPv6 socket (Go's dialer
// would use an IPv4 one): the path through connect6 to an IPv4 entry.
func dialMapped(addr string) (ClientResult, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return ClientResult{}, err
	}
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return ClientResult{}, err
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(Timeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := unix.Connect(fd, &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}); err != nil {
		return ClientResult{}, fmt.Errorf("connect: %w", err)
	}
	sa, err := unix.Getpeername(fd)
	if err != nil {
		return ClientResult{}, fmt.Errorf("getpeername: %w", err)
	}
	buf := make([]byte, 256)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return ClientResult{}, err
	}
	return ClientResult{Reply: strings.TrimSpace(string(buf[:n])), Peer: sockaddrString(sa)}, nil
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), fmt.Sprint(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return fmt.Sprint(sa)
}

// rateLoop dials addr over TCP up to n times, one connection after
// another (connect, read a line until the server closes, close), for at
// most limit. It makes the
// system calls itself, blocking, so that what it measures is the kernel's
// path more than Go's poller.
func rateLoop(addr string, n int, limit time.Duration) (int, time.Duration, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return 0, 0, err
	}
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())})
	if ap.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	tv := unix.NsecToTimeval(Timeout.Nanoseconds())
	buf := make([]byte, 128)
	start := time.Now()
	done := 0
	for done < n && time.Since(start) < limit {
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return done, 0, err
		}
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
		if err = unix.Connect(fd, sa); err == nil {
			// the line, then the server's close: the server closes
			// first, so TIME_WAIT stays in its namespace and the node's
			// ephemeral ports do not run out over the runs
			got := 0
			for {
				k, rerr := unix.Read(fd, buf)
				if rerr != nil {
					err = rerr
					break
				}
				if k == 0 {
					break
				}
				got += k
			}
			if err == nil && got == 0 {
				err = io.ErrUnexpectedEOF
			}
		}
		unix.Close(fd)
		if err != nil {
			return done, 0, fmt.Errorf("connection %d to %s: %w", done+1, addr, err)
		}
		done++
	}
	return done, time.Since(start), nil
}

// UDPSession is a client process in the test's cgroup holding one
// connected UDP socket (connect(), then send and recv) for its lifetime.
type UDPSession struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// ConnectedUDP starts a client that connects one UDP socket to addr.
func (s *CgroupSite) ConnectedUDP(addr string) (*UDPSession, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.inCgroup(cmd, "udpconn "+addr, false, cmd.Start); err != nil {
		return nil, err
	}
	return &UDPSession{cmd: cmd, in: in, out: bufio.NewReader(out)}, nil
}

// Ask sends one datagram on the session's socket and returns the reply
// line, or the error the client met.
func (u *UDPSession) Ask() (string, error) {
	if _, err := io.WriteString(u.in, "ask\n"); err != nil {
		return "", err
	}
	line, err := u.out.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("udp session: %w", err)
	}
	line = strings.TrimSpace(line)
	if msg, ok := strings.CutPrefix(line, "error "); ok {
		return "", errors.New(msg)
	}
	return line, nil
}

// Close ends the client.
func (u *UDPSession) Close() error {
	u.in.Close()
	return u.cmd.Wait()
}

// connectedUDP is the client of a UDPSession: one connected socket; for
// each line on stdin one datagram out and the reply (or "error ...") on
// stdout.
func connectedUDP(addr string) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	in := bufio.NewScanner(os.Stdin)
	buf := make([]byte, 1500)
	for in.Scan() {
		_ = c.SetDeadline(time.Now().Add(Timeout))
		n := 0
		if _, err = c.Write([]byte("hi\n")); err == nil {
			n, err = c.Read(buf)
		}
		if err != nil {
			fmt.Printf("error %v\n", err)
			continue
		}
		fmt.Printf("%s\n", strings.TrimSpace(string(buf[:n])))
	}
	return in.Err()
}
