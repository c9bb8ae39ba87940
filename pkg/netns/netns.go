// Package netns names the network namespace the calling thread is in, by
// the kernel's cookie for it: unlike the namespace's inode number, a
// cookie is never given to another namespace while the machine runs.
package netns

import (
	"errors"
	"path/filepath"
	"strings"

	"fmt"

	"golang.org/x/sys/unix"
)

// Cookie is the cookie of the calling thread's network namespace
// (SO_NETNS_COOKIE, Linux 5.14).
func Cookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("netns cookie (SO_NETNS_COOKIE, Linux 5.14): %w", err)
	}
	return c, nil
}

// ID names the calling thread's network namespace for files that must
// differ per namespace: "cookie-N" where the kernel has cookies, else
// "inode-N" (an inode number may be reused once its namespace is gone).
func ID() (string, error) { return id(Cookie, "/proc/thread-self/ns/net") }

// id is ID with the cookie's source and the namespace's file given.
func id(cookie func() (uint64, error), nsFile string) (string, error) {
	if c, err := cookie(); err == nil {
		return fmt.Sprintf("cookie-%d", c), nil
	}
	var st unix.Stat_t
	if err := unix.Stat(nsFile, &st); err != nil {
		return "", fmt.Errorf("network namespace of this thread: %w", err)
	}
	return fmt.Sprintf("inode-%d", st.Ino), nil
}

// Gone reports whether the network namespace a runtime named by path
// (CNI_NETNS) no longer exists, as far as this process can tell: the
// file is gone from a directory that is still there. It says false when
// it cannot tell — no path, a path under /proc (a process's namespace,
// meaningful only in the runtime's PID namespace), a directory this
// process does not see (an agent in a container without the host's
// /run) — so that nothing is ever taken from a container that may be
// alive.
func Gone(path string) bool {
	if path == "" || !filepath.IsAbs(path) || strings.HasPrefix(path, "/proc/") {
		return false
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); !errors.Is(err, unix.ENOENT) {
		return false
	}
	err := unix.Stat(filepath.Dir(path), &st)
	return err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}
