package nfnl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portmap-dev/portmap/test/userns"
)

// The package's tests run in a user and network namespace of their own
// (no root needed): the kernel tests below write nf_tables objects there.
func TestMain(m *testing.M) { userns.Main(m) }

const testTable = "nfnl_test"

// jump is NFT_JUMP, as the kernel reads a verdict code (signed).
var jump int32 = unix.NFT_JUMP

func tableMsg(typ int, flags uint16) Msg {
	var a Attrs
	a.String(unix.NFTA_TABLE_NAME, testTable)
	return Msg{Type: NftType(typ), Flags: flags, Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()}
}

func chainMsg(name string) Msg {
	var a Attrs
	a.String(unix.NFTA_CHAIN_TABLE, testTable).String(unix.NFTA_CHAIN_NAME, name)
	return Msg{Type: NftType(unix.NFT_MSG_NEWCHAIN), Flags: unix.NLM_F_CREATE, Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()}
}

// jumpRule is a rule of chain from that jumps to chain to.
func jumpRule(from, to string) Msg {
	var a Attrs
	a.String(unix.NFTA_RULE_TABLE, testTable).String(unix.NFTA_RULE_CHAIN, from)
	a.Nested(unix.NFTA_RULE_EXPRESSIONS|unix.NLA_F_NESTED, func(l *Attrs) {
		l.Nested(unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, func(e *Attrs) {
			e.String(unix.NFTA_EXPR_NAME, "immediate")
			e.Nested(unix.NFTA_EXPR_DATA|unix.NLA_F_NESTED, func(d *Attrs) {
				d.U32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
				d.Nested(unix.NFTA_IMMEDIATE_DATA|unix.NLA_F_NESTED, func(v *Attrs) {
					v.Nested(unix.NFTA_DATA_VERDICT|unix.NLA_F_NESTED, func(vd *Attrs) {
						vd.Raw(unix.NFTA_VERDICT_CODE, binary.BigEndian.AppendUint32(nil, uint32(jump)))
						vd.String(unix.NFTA_VERDICT_CHAIN, to)
					})
				})
			})
		})
	})
	return Msg{Type: NftType(unix.NFT_MSG_NEWRULE), Flags: unix.NLM_F_CREATE | unix.NLM_F_APPEND, Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()}
}

// A batch on the real kernel: all or nothing, a check that changes
// nothing, the failing message named; gets and dumps read back what it
// wrote, a missing object answers ENOENT.
func TestKernel(t *testing.T) {
	userns.Require(t)
	c, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	objects := []Msg{tableMsg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE), chainMsg("a"), chainMsg("b"), jumpRule("a", "b"), jumpRule("a", "b")}

	// A check (no commit) changes nothing.
	if err := c.Batch(objects, false); err != nil {
		t.Fatalf("check: %v", err)
	}
	if _, err := c.GetOne(tableMsg(unix.NFT_MSG_GETTABLE, 0)); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("the table after a check: %v, want ENOENT", err)
	}
	// A batch with a bad message applies none, and names the message.
	bad := append(slices.Clone(objects), jumpRule("a", "missing"))
	var e *Error
	if err := c.Batch(bad, true); !errors.As(err, &e) || e.Index != len(bad)-1 || !errors.Is(err, unix.ENOENT) {
		t.Fatalf("batch with a jump to a missing chain: %v (%+v), want ENOENT at %d", err, e, len(bad)-1)
	}
	if _, err := c.GetOne(tableMsg(unix.NFT_MSG_GETTABLE, 0)); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("the table after a failed batch: %v, want ENOENT", err)
	}
	if err := c.Batch(objects, true); err != nil {
		t.Fatalf("batch: %v", err)
	}

	rep, err := c.GetOne(tableMsg(unix.NFT_MSG_GETTABLE, 0))
	if v, _ := Find(rep.Attrs, unix.NFTA_TABLE_NAME); err != nil || (Attr{Value: v}).String() != testTable || rep.Type != NftType(unix.NFT_MSG_NEWTABLE) {
		t.Fatalf("GetOne(table) = %+v, %v", rep, err)
	}
	var gets []Msg
	for _, name := range []string{"a", "nope", "b"} {
		var a Attrs
		a.String(unix.NFTA_CHAIN_TABLE, testTable).String(unix.NFTA_CHAIN_NAME, name)
		gets = append(gets, Msg{Type: NftType(unix.NFT_MSG_GETCHAIN), Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()})
	}
	replies, errs, err := c.Get(gets)
	if err != nil || errs[0] != nil || errs[2] != nil || !errors.As(errs[1], &e) || e.Index != 1 || !errors.Is(errs[1], unix.ENOENT) {
		t.Fatalf("Get(a, nope, b) = %v, %v", errs, err)
	}
	if v, _ := Find(replies[2].Attrs, unix.NFTA_CHAIN_NAME); (Attr{Value: v}).String() != "b" {
		t.Errorf("the third reply names %q", v)
	}

	var a Attrs
	a.String(unix.NFTA_RULE_TABLE, testTable).String(unix.NFTA_RULE_CHAIN, "a")
	rules, err := c.Dump(Msg{Type: NftType(unix.NFT_MSG_GETRULE), Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()})
	if err != nil || len(rules) != 2 {
		t.Fatalf("Dump(rules of a) = %d rules, %v", len(rules), err)
	}
	var handles []uint64
	for _, r := range rules {
		h, chains := RuleJumps(r.Attrs)
		if h == 0 || strings.Join(chains, ",") != "b" {
			t.Errorf("RuleJumps = %d, %q; want a handle and b", h, chains)
		}
		handles = append(handles, h)
	}
	if handles[0] >= handles[1] {
		t.Errorf("handles %v: want the order the rules were added", handles)
	}
	if err := c.Batch([]Msg{tableMsg(unix.NFT_MSG_DELTABLE, 0)}, true); err != nil {
		t.Fatalf("delete the table: %v", err)
	}
}

// TestAnswersOfOthers: an answer left unread on the socket (a request
// whose error nobody read) is not taken for an error of the batch that
// follows, nor of a get; a dump whose message does not fit the read
// buffer fails with ErrTruncated instead of returning what was cut off.
func TestAnswersOfOthers(t *testing.T) {
	userns.Require(t)
	c, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stale := func() {
		t.Helper()
		// a get of a table that does not exist, its ENOENT left unread
		b := appendMsg(nil, tableMsg(unix.NFT_MSG_GETTABLE, 0), 0, c.seq.Add(1), 0)
		if err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			t.Fatal(err)
		}
	}
	stale()
	if err := c.Batch([]Msg{tableMsg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE), chainMsg("a"), chainMsg("b")}, true); err != nil {
		t.Fatalf("a batch after an unread answer: %v", err)
	}
	defer func() { _ = c.Batch([]Msg{tableMsg(unix.NFT_MSG_DELTABLE, 0)}, true) }()
	stale()
	if _, err := c.GetOne(tableMsg(unix.NFT_MSG_GETTABLE, 0)); err != nil {
		t.Fatalf("a get after an unread answer: %v", err)
	}

	// a rule of 40 jumps: some 2.5 KB of expressions in one message
	var long Attrs
	long.String(unix.NFTA_RULE_TABLE, testTable).String(unix.NFTA_RULE_CHAIN, "a")
	one, _ := Find(jumpRule("a", "b").Attrs, unix.NFTA_RULE_EXPRESSIONS)
	long.Raw(unix.NFTA_RULE_EXPRESSIONS|unix.NLA_F_NESTED, bytes.Repeat(one, 40))
	r := Msg{Type: NftType(unix.NFT_MSG_NEWRULE), Flags: unix.NLM_F_CREATE | unix.NLM_F_APPEND, Family: unix.NFPROTO_IPV4, Attrs: long.Bytes()}
	if err := c.Batch([]Msg{r}, true); err != nil {
		t.Fatalf("add the long rule: %v", err)
	}
	var a Attrs
	a.String(unix.NFTA_RULE_TABLE, testTable).String(unix.NFTA_RULE_CHAIN, "a")
	dump := Msg{Type: NftType(unix.NFT_MSG_GETRULE), Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()}
	if rules, err := c.Dump(dump); err != nil || len(rules) != 1 {
		t.Fatalf("dump of the long rule: %d rules, %v", len(rules), err)
	}
	c.readSize = 1024
	if rules, err := c.Dump(dump); !errors.Is(err, ErrTruncated) {
		t.Errorf("dump into 1 KiB: %d rules, %v; want ErrTruncated", len(rules), err)
	}
}

// One Conn shared by goroutines: each request gets its own answers (a
// get's ENOENT, a dump's end), none takes another's, none waits for
// ever.
func TestSharedConn(t *testing.T) {
	userns.Require(t)
	c, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Batch([]Msg{tableMsg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE), chainMsg("a")}, true); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Batch([]Msg{tableMsg(unix.NFT_MSG_DELTABLE, 0)}, true) }()
	var a Attrs
	a.String(unix.NFTA_CHAIN_TABLE, testTable)
	chains := Msg{Type: NftType(unix.NFT_MSG_GETCHAIN), Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()}
	var missing Attrs
	missing.String(unix.NFTA_TABLE_NAME, "no-such-table")
	get := Msg{Type: NftType(unix.NFT_MSG_GETTABLE), Family: unix.NFPROTO_IPV4, Attrs: missing.Bytes()}
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range 200 {
				if g%2 == 0 {
					if _, err := c.GetOne(get); !errors.Is(err, unix.ENOENT) {
						errs <- fmt.Errorf("get %d: %v, want ENOENT", i, err)
						return
					}
				} else if out, err := c.Dump(chains); err != nil || len(out) != 1 {
					errs <- fmt.Errorf("dump %d: %d chains, %v; want 1", i, len(out), err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(3 * ReadTimeout):
			t.Fatal("a request of a shared Conn did not return")
		}
	}
}

// A read that the kernel does not answer ends after ReadTimeout (here
// a receive with nothing sent, on a socket whose timeout is shortened).
func TestReadDeadline(t *testing.T) {
	userns.Require(t)
	c, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tv, err := unix.GetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO); err != nil || time.Duration(tv.Nano()) != ReadTimeout {
		t.Errorf("the socket's read timeout: %v %v, want %s", tv, err, ReadTimeout)
	}
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = recv(c.fd, make([]byte, 4096), 0)
	if !errors.Is(err, ErrNoAnswer) || time.Since(start) > 2*time.Second {
		t.Errorf("a read with nothing to answer: %v after %s, want ErrNoAnswer at the timeout", err, time.Since(start))
	}
}

// The raw requests of other families, on the test's own namespace: a
// route dump (its loopback's local routes once it is up), a route get
// answered with its reply, one refused with the kernel's errno, and an
// acknowledged request that has no reply.
func TestRaw(t *testing.T) {
	userns.Require(t)
	rt, err := OpenProtocol(unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	// RTM_NEWLINK: lo up (struct ifinfomsg: family, pad, type, index, flags, change)
	up := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(up[4:], uint32(lo.Index))
	binary.NativeEndian.PutUint32(up[8:], unix.IFF_UP)
	binary.NativeEndian.PutUint32(up[12:], unix.IFF_UP)
	if reply, err := rt.Exec(unix.RTM_NEWLINK, up); err != nil || reply != nil {
		t.Fatalf("set lo up: reply %x, %v; want an acknowledgement alone", reply, err)
	}
	routes, err := rt.DumpRaw(unix.RTM_GETROUTE, make([]byte, unix.SizeofRtMsg))
	if err != nil || len(routes) == 0 {
		t.Fatalf("route dump: %d routes, %v", len(routes), err)
	}
	get := func(ip net.IP) ([]byte, error) {
		req := make([]byte, unix.SizeofRtMsg)
		req[0], req[1] = unix.AF_INET, 32
		var a Attrs
		a.Raw(unix.RTA_DST, ip.To4())
		return rt.Exec(unix.RTM_GETROUTE, append(req, a.Bytes()...))
	}
	reply, err := get(net.IPv4(127, 0, 0, 1))
	if err != nil || len(reply) < unix.SizeofRtMsg {
		t.Fatalf("route to 127.0.0.1: %x %v", reply, err)
	}
	oif, ok := Find(reply[unix.SizeofRtMsg:], unix.RTA_OIF)
	if !ok || int(binary.NativeEndian.Uint32(oif)) != lo.Index {
		t.Errorf("route to 127.0.0.1 leaves by %x, want lo (%d)", oif, lo.Index)
	}
	var e *Error
	if _, err := get(net.IPv4(203, 0, 113, 9)); !errors.As(err, &e) || e.Errno != unix.ENETUNREACH {
		t.Errorf("route to an address no route leads to: %v, want ENETUNREACH", err)
	}
}

// tables lists the namespace's nf_tables tables as "family name".
func tables(t *testing.T, c *Conn) []string {
	t.Helper()
	reps, err := c.Dump(Msg{Type: NftType(unix.NFT_MSG_GETTABLE), Family: unix.NFPROTO_UNSPEC})
	if err != nil {
		t.Fatalf("dump tables: %v", err)
	}
	var out []string
	for _, r := range reps {
		v, _ := Find(r.Attrs, unix.NFTA_TABLE_NAME)
		out = append(out, strconv.Itoa(int(r.Family))+" "+(Attr{Value: v}).String())
	}
	slices.Sort(out)
	return out
}

// generation is the namespace's nf_tables generation, which every
// committed change moves on.
func generation(t *testing.T, c *Conn) uint32 {
	t.Helper()
	rep, err := c.GetOne(Msg{Type: NftType(unix.NFT_MSG_GETGEN)})
	v, ok := Find(rep.Attrs, unix.NFTA_GEN_ID)
	if err != nil || !ok {
		t.Fatalf("get generation: %v", err)
	}
	return (Attr{Value: v}).U32()
}

// The write probe on the real kernel takes nothing: every table is still
// there, a table named ProbeTable too (the destroy goes by handle 0, so
// the name is never what it deletes), and the generation has not moved,
// so nothing was committed. Without CAP_NET_ADMIN it is refused, and of
// no family it sends nothing.
func TestWritable(t *testing.T) {
	userns.Require(t)
	if !ReleaseAtLeast(Release(), 6, 3) {
		t.Skipf("kernel %s has no destroy messages", Release())
	}
	c, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var msgs []Msg
	for _, f := range []uint8{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6, unix.NFPROTO_INET} {
		for _, name := range []string{testTable, ProbeTable} {
			var a Attrs
			a.String(unix.NFTA_TABLE_NAME, name)
			msgs = append(msgs, Msg{Type: NftType(unix.NFT_MSG_NEWTABLE), Flags: unix.NLM_F_CREATE, Family: f, Attrs: a.Bytes()})
		}
	}
	if err := c.Batch(msgs, true); err != nil {
		t.Fatal(err)
	}
	before, gen := tables(t, c), generation(t, c)
	if len(before) != 6 {
		t.Fatalf("tables %q: want 6", before)
	}
	for _, f := range []uint8{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6} {
		if err := c.Writable(f); err != nil {
			t.Errorf("Writable(%d): %v", f, err)
		}
	}
	if after := tables(t, c); !slices.Equal(after, before) {
		t.Errorf("tables after the probes %q, before %q", after, before)
	}
	if g := generation(t, c); g != gen {
		t.Errorf("generation %d after the probes, %d before: something was committed", g, gen)
	}
	if err := c.Writable(unix.NFPROTO_UNSPEC); err == nil {
		t.Error("Writable(NFPROTO_UNSPEC): nil")
	}
	if got := tables(t, c); !slices.Equal(got, before) {
		t.Errorf("tables after a probe of no family %q", got)
	}

	// Without CAP_NET_ADMIN in effect (on a thread of its own, which
	// ends with the goroutine) nf_tables refuses the probe.
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		data[0].Effective &^= 1 << unix.CAP_NET_ADMIN
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		errc <- c.Writable(unix.NFPROTO_IPV4)
	}()
	if err := <-errc; !errors.Is(err, unix.EPERM) {
		t.Errorf("Writable without CAP_NET_ADMIN: %v, want EPERM", err)
	}
}

func TestReleaseAtLeast(t *testing.T) {
	for _, tt := range []struct {
		release      string
		major, minor int
		want         bool
	}{
		{"6.18.44-fc-v595", 6, 3, true},
		{"6.3.0", 6, 3, true},
		{"6.3-rc1", 6, 3, true},
		{"6.2.16-300.fc38.x86_64", 6, 3, false},
		{"5.15.0-130-generic", 6, 3, false},
		{"7.0.1", 6, 15, true},
		{"6.14.11-300.fc42.x86_64", 6, 15, false},
		{"", 6, 3, false},
		{"x", 6, 3, false},
	} {
		if got := ReleaseAtLeast(tt.release, tt.major, tt.minor); got != tt.want {
			t.Errorf("ReleaseAtLeast(%q, %d, %d) = %v, want %v", tt.release, tt.major, tt.minor, got, tt.want)
		}
	}
}
