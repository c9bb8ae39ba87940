package nfnl

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoProbe is Writable's answer where it cannot tell: the kernel has
// no destroy messages (they came in Linux 6.3). The caller checks
// another way.
var ErrNoProbe = errors.New("nf_tables has no destroy messages (Linux 6.3)")

// ProbeTable names the table Writable destroys: one that nothing creates.
const ProbeTable = "cni_portmap_write_probe"

// NFT_MSG_DESTROYTABLE and NFTA_TABLE_HANDLE, which x/sys does not name.
const (
	msgDestroyTable = 0x1a
	attrTableHandle = 4
)

// Writable reports whether nf_tables takes changes from this socket in
// the calling thread's network namespace for family (NFPROTO_IPV4 or
// NFPROTO_IPV6), and changes nothing. It commits a batch of one destroy
// of a table that cannot exist: by handle 0, which the kernel never
// gives (table handles count from 1), and by ProbeTable's name. The
// kernel takes the destroy of a missing table as done, so the batch
// commits with nothing in it: no generation, no notification, and no
// RCU grace period, which a batch the kernel aborts waits for while it
// holds nf_tables' commit lock (the way of nft --check, about 10 ms).
// It needs what every change needs: CAP_NET_ADMIN over the namespace,
// and the security module's leave to write.
func (c *Conn) Writable(family uint8) error {
	if family == unix.NFPROTO_UNSPEC {
		// A table delete of no family empties every family's tables.
		return fmt.Errorf("write probe: no family")
	}
	if !ReleaseAtLeast(Release(), 6, 3) {
		return ErrNoProbe
	}
	var a Attrs
	a.String(unix.NFTA_TABLE_NAME, ProbeTable).Raw(attrTableHandle, make([]byte, 8))
	err := c.Batch([]Msg{{Type: NftType(msgDestroyTable), Family: family, Attrs: a.Bytes()}}, true)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
		// A kernel that reads as 6.3 or later without the message.
		return ErrNoProbe
	}
	if err != nil {
		return fmt.Errorf("nf_tables write probe: %w", err)
	}
	return nil
}

// Release is the running kernel's release ("6.18.44-…"), "" when uname
// fails.
func Release() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// ReleaseAtLeast reports whether release is Linux major.minor or later;
// false when it cannot be read.
func ReleaseAtLeast(release string, major, minor int) bool {
	maj, rest, _ := strings.Cut(release, ".")
	mnr, _, _ := strings.Cut(rest, ".")
	mnr, _, _ = strings.Cut(mnr, "-")
	m, err1 := strconv.Atoi(maj)
	n, err2 := strconv.Atoi(mnr)
	if err1 != nil || err2 != nil {
		return false
	}
	return m > major || m == major && n >= minor
}
