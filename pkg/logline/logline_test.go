package logline

import (
	"bytes"
	"errors"
	"log"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// values are what the agent logs, and the edges of quoting and escaping.
var values = []any{"", "plain", "a b", "x=y", `say "hi"`, "back\\slash", "tab\there", "new\nline", "ünïcode", "nbsp\u00a0x",
	"\x00\x1f\x7f", "bad \xff utf-8", "<html> & co", "line\u2028sep", "ipv4: chain missing", 0, 42, -7,
	errors.New("exit status 1: iptables: No chain")}

// TestAsSlog: every record reads as log/slog's text and JSON handlers
// write it (the time left out of both).
func TestAsSlog(t *testing.T) {
	noTime := &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}
	for _, json := range []bool{false, true} {
		var got, want bytes.Buffer
		l := New(&got, json)
		l.Now = nil
		var h slog.Handler = slog.NewTextHandler(&want, noTime)
		if json {
			h = slog.NewJSONHandler(&want, noTime)
		}
		s := slog.New(h)
		for i, v := range values {
			msg := []string{"pass", "attachment repaired", "kept", "cache entry skipped"}[i%4]
			l.Info(msg, "value", v, "n", i)
			s.Info(msg, "value", v, "n", i)
			l.Warn(msg, "k", v)
			s.Warn(msg, "k", v)
			l.Error(msg)
			s.Error(msg)
		}
		if got.String() != want.String() {
			g, w := strings.Split(got.String(), "\n"), strings.Split(want.String(), "\n")
			for i := range min(len(g), len(w)) {
				if g[i] != w[i] {
					t.Errorf("json %v, line %d:\n got %s\nwant %s", json, i, g[i], w[i])
				}
			}
		}
	}
}

// TestTimeAndWriter: a record starts with its time as slog writes it;
// a *log.Logger over Writer logs each line as one record's message.
func TestTimeAndWriter(t *testing.T) {
	var b bytes.Buffer
	l := New(&b, false)
	at := time.Date(2026, 11, 26, 8, 0, 0, 123456789, time.UTC)
	l.Now = func() time.Time { return at }
	l.Info("watching", "cache", "/var/lib/cni/results")
	log.New(l.Writer(Warn), "", 0).Printf("http: TLS handshake error from %s", "192.0.2.1:5")
	want := "time=2026-11-26T08:00:00.123Z level=INFO msg=watching cache=/var/lib/cni/results\n" +
		"time=2026-11-26T08:00:00.123Z level=WARN msg=\"http: TLS handshake error from 192.0.2.1:5\"\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	var s bytes.Buffer
	slog.New(slog.NewTextHandler(&s, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Time(slog.TimeKey, at)
		}
		return a
	}})).Info("watching", "cache", "/var/lib/cni/results")
	if first := strings.SplitAfter(b.String(), "\n")[0]; first != s.String() {
		t.Errorf("time: got %q, slog writes %q", first, s.String())
	}
}
