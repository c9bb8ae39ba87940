package socket

import (
	"errors"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// TestReadyByteOrder: on a big-endian machine the socket path is not
// served, and says so before anything else; on a little-endian one the
// byte order is never the reason (qemu-user runs this for s390x in
// make cross-test).
func TestReadyByteOrder(t *testing.T) {
	s, err := OpenSite(plan.Socket{CgroupPath: t.TempDir(), PinDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Ready()
	if bigEndian() != errors.Is(err, errBigEndian) {
		t.Errorf("Ready on a machine big-endian %v: %v", bigEndian(), err)
	}
}
