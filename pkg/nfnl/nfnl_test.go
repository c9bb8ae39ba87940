package nfnl

import (
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

func TestAttrsRoundTrip(t *testing.T) {
	var a Attrs
	a.String(1, "cni_portmap").U32(2, 0x2000).Nested(3, func(n *Attrs) { n.Raw(1, []byte{1, 2, 3}) })
	got := Parse(a.Bytes())
	if len(got) != 3 || got[0].String() != "cni_portmap" || got[1].U32() != 0x2000 || got[2].Type != 3 {
		t.Fatalf("Parse = %+v", got)
	}
	if v, ok := Find(got[2].Value, 1); !ok || string(v) != "\x01\x02\x03" {
		t.Errorf("nested = %x, %v", v, ok)
	}
	if len(a.Bytes())%4 != 0 {
		t.Errorf("attributes not padded: %d bytes", len(a.Bytes()))
	}
	// A length past the end stops the parse instead of reading beyond.
	if got := Parse([]byte{200, 0, 1, 0, 'x'}); len(got) != 0 {
		t.Errorf("Parse of a truncated attribute = %+v", got)
	}
	if (Attr{Value: []byte{1}}).U32() != 0 {
		t.Error("U32 of a short value is not 0")
	}
}

// errorMsg frames an NLMSG_ERROR answer to the message with seq, as the
// kernel sends it with NETLINK_CAP_ACK and NETLINK_EXT_ACK.
func errorMsg(seq uint32, errno unix.Errno, text string) []byte {
	var body []byte
	body = binary.NativeEndian.AppendUint32(body, uint32(-int32(errno)))
	echo := make([]byte, nlmsgHdrLen)
	binary.NativeEndian.PutUint32(echo[8:12], seq)
	body = append(body, echo...)
	var tlv Attrs
	tlv.String(unix.NLMSGERR_ATTR_MSG, text)
	body = append(body, tlv.Bytes()...)
	var b []byte
	b = binary.NativeEndian.AppendUint32(b, uint32(nlmsgHdrLen+len(body)))
	b = binary.NativeEndian.AppendUint16(b, unix.NLMSG_ERROR)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_CAPPED|unix.NLM_F_ACK_TLVS)
	b = binary.NativeEndian.AppendUint32(b, 99)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return append(b, body...)
}

func TestErrorAnswer(t *testing.T) {
	b := append(errorMsg(7, unix.EEXIST, "chain exists"), errorMsg(8, unix.ENOENT, "")...)
	msgs := split(b)
	if len(msgs) != 2 {
		t.Fatalf("split: %d messages", len(msgs))
	}
	e := msgs[0].err()
	if msgs[0].errSeq != 7 || e == nil || e.Errno != unix.EEXIST || e.Text != "chain exists" {
		t.Errorf("first: seq %d, %+v", msgs[0].errSeq, e)
	}
	if !errors.Is(e, unix.EEXIST) || e.Error() != "file exists (chain exists)" {
		t.Errorf("error %q does not unwrap to EEXIST", e)
	}
	if e := msgs[1].err(); msgs[1].errSeq != 8 || e.Errno != unix.ENOENT {
		t.Errorf("second: %+v", e)
	}
}

func TestAppendMsg(t *testing.T) {
	var a Attrs
	a.String(1, "t")
	b := appendMsg(nil, Msg{Type: 0x0a03, Flags: unix.NLM_F_CREATE, Family: unix.NFPROTO_IPV4, Attrs: a.Bytes()}, 0, 5, 0)
	msgs := split(b)
	if len(msgs) != 1 || msgs[0].typ != 0x0a03 || msgs[0].seq != 5 || msgs[0].family != unix.NFPROTO_IPV4 ||
		msgs[0].flags != unix.NLM_F_REQUEST|unix.NLM_F_CREATE {
		t.Fatalf("split(appendMsg) = %+v", msgs)
	}
	if v, ok := Find(msgs[0].attrs, 1); !ok || string(v) != "t\x00" {
		t.Errorf("attrs = %x", msgs[0].attrs)
	}
}

func TestGroups(t *testing.T) {
	msg := func(attrs int) Msg { return Msg{Attrs: make([]byte, attrs)} }
	each := align(nlmsgHdrLen + nfgenLen + 100)
	many := make([]Msg, 10)
	for i := range many {
		many[i] = msg(100)
	}
	for _, tc := range []struct {
		name  string
		reqs  []Msg
		limit int
		want  [][2]int
	}{
		{"none", nil, 1000, nil},
		{"all fit", many, 10 * each, [][2]int{{0, 10}}},
		{"three a group", many, 3*each + 1, [][2]int{{0, 3}, {3, 6}, {6, 9}, {9, 10}}},
		{"one larger than the limit", []Msg{msg(100), msg(5000), msg(100)}, 2 * each, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := groups(tc.reqs, tc.limit)
			if len(got) != len(tc.want) {
				t.Fatalf("groups = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("groups = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// doneMsg frames an NLMSG_DONE with errno (0: a dump that ended well)
// and, with text, the extended ack's message.
func doneMsg(errno unix.Errno, text string) []byte {
	var body []byte
	body = binary.NativeEndian.AppendUint32(body, uint32(-int32(errno)))
	flags := uint16(unix.NLM_F_MULTI)
	if text != "" {
		var tlv Attrs
		tlv.String(unix.NLMSGERR_ATTR_MSG, text)
		body = append(body, tlv.Bytes()...)
		flags |= unix.NLM_F_ACK_TLVS
	}
	var b []byte
	b = binary.NativeEndian.AppendUint32(b, uint32(nlmsgHdrLen+len(body)))
	b = binary.NativeEndian.AppendUint16(b, unix.NLMSG_DONE)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, 5)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return append(b, body...)
}

// bodyless is the header of message b alone.
func bodyless(b []byte) []byte {
	b = b[:nlmsgHdrLen:nlmsgHdrLen]
	binary.NativeEndian.PutUint32(b[0:4], nlmsgHdrLen)
	return b
}

// The end of a dump carries the dump's error: a dump the kernel could
// not finish is an error, not a short answer.
func TestDoneError(t *testing.T) {
	for _, tt := range []struct {
		b    []byte
		want error
		text string
	}{
		{doneMsg(0, ""), nil, ""},
		{doneMsg(unix.EINTR, ""), unix.EINTR, ""},
		{doneMsg(unix.ENOMEM, "no room"), unix.ENOMEM, "no room"},
		{bodyless(doneMsg(unix.EINTR, "")), nil, ""}, // a DONE without a body
	} {
		msgs := split(tt.b)
		if len(msgs) != 1 {
			t.Fatalf("split: %d messages", len(msgs))
		}
		e := msgs[0].doneErr()
		switch {
		case tt.want == nil && e != nil:
			t.Errorf("doneErr = %v, want none", e)
		case tt.want != nil && (e == nil || !errors.Is(e, tt.want) || e.Text != tt.text):
			t.Errorf("doneErr = %v, want %v (%q)", e, tt.want, tt.text)
		}
	}
}
