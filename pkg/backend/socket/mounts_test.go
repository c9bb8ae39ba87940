package socket

import (
	"slices"
	"testing"
)

// cgroup2Roots finds the node's cgroup v2 root from any cgroup namespace:
// mountinfo shows a cgroup mount's root relative to the reader's.
func TestCgroup2Roots(t *testing.T) {
	const (
		v1      = "30 25 0:26 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu\n"
		unified = "31 25 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
		onHost  = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
		// a pod with a cgroup namespace of its own, chrooted into the
		// host's / (the DaemonSet's --root): the runtime's mount of the
		// pod's cgroup and the host's, three levels up
		podOwn  = "610 600 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate\n"
		podHost = "652 640 0:30 /../../.. /host/sys/fs/cgroup rw,nosuid,nodev,noexec,relatime master:9 - cgroup2 cgroup2 rw,nsdelegate\n"
		subtree = "700 600 0:30 /kubepods.slice /run/sub rw - cgroup2 cgroup2 rw\n"
		below   = "701 600 0:30 /../../other /run/other rw - cgroup2 cgroup2 rw\n"
		spaced  = "702 600 0:30 /.. /run/my\\040cgroup rw - cgroup2 cgroup2 rw\n"
		opts    = "703 600 0:30 / /run/opts rw shared:1 master:2 propagate_from:2 - cgroup2 cgroup2 rw\n"
	)
	for _, tt := range []struct {
		name, mountinfo string
		want            []string
	}{
		{"a unified host", onHost, []string{"/sys/fs/cgroup"}},
		{"a hybrid host", v1 + unified, []string{"/sys/fs/cgroup/unified"}},
		{"a pod in a cgroup namespace: the host's mount", podOwn + podHost, []string{"/host/sys/fs/cgroup", "/sys/fs/cgroup"}},
		{"the host's mount first in the table", podHost + podOwn, []string{"/host/sys/fs/cgroup", "/sys/fs/cgroup"}},
		{"chrooted: the host's mount alone", "652 640 0:30 /../../.. /sys/fs/cgroup rw master:9 - cgroup2 cgroup2 rw\n", []string{"/sys/fs/cgroup"}},
		{"subtrees are no root", subtree + below, []string{}},
		{"an escaped mount point", spaced, []string{"/run/my cgroup"}},
		{"optional fields", opts, []string{"/run/opts"}},
		{"none", v1, []string{}},
		{"garbage", "x\n\n- cgroup2\n1 2 3 - cgroup2\n", []string{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := cgroup2Roots(tt.mountinfo); !slices.Equal(got, tt.want) {
				t.Errorf("cgroup2Roots = %q, want %q", got, tt.want)
			}
		})
	}
}
