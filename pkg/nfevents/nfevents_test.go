package nfevents

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/test/userns"
)

// The tests run in a user and network namespace of their own (no root
// needed): they change the firewall there.
func TestMain(m *testing.M) { userns.Main(m) }

// A committed change brings one token; changes while one is pending
// coalesce into it; Drain drops it; Close closes C.
func TestSubscription(t *testing.T) {
	userns.Require(t)
	s, err := Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	c, err := nfnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	change := func(msg int, name string) {
		var a nfnl.Attrs
		a.String(unix.NFTA_TABLE_NAME, name)
		if err := c.Batch([]nfnl.Msg{{Type: nfnl.NftType(msg), Flags: unix.NLM_F_CREATE, Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()}}, true); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(what string) {
		select {
		case <-s.C:
		case <-time.After(5 * time.Second):
			t.Fatalf("no token in 5 s after %s", what)
		}
	}
	change(unix.NFT_MSG_NEWTABLE, "a")
	wait("a new table")
	change(unix.NFT_MSG_NEWTABLE, "b")
	change(unix.NFT_MSG_DELTABLE, "b")
	time.Sleep(100 * time.Millisecond) // both read, one token pending
	s.Drain()
	select {
	case <-s.C:
		t.Error("a token after Drain: changes did not coalesce into one")
	case <-time.After(200 * time.Millisecond):
	}
	s.Close()
	select {
	case _, ok := <-s.C:
		for ok {
			_, ok = <-s.C
		}
	case <-time.After(2 * time.Second):
		t.Fatal("C not closed 2 s after Close")
	}
}
