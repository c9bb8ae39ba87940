// Package logline writes the agent's log: one record a line, in the two
// formats of log/slog's handlers, text (time=… level=INFO msg=… key=value)
// and JSON (one object a line), which operators' collectors and our
// tests read. It is what the agent uses of log/slog, without it: the
// plugin's binary, which carries `portmap sync --watch`, is held to 7 MB,
// and log/slog with its handlers is ~100 KB of it.
package logline

import (
	"io"
	"strconv"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Level is a record's severity, as slog names them.
type Level int

// The levels the agent logs at.
const (
	Info Level = iota
	Warn
	Error
)

func (l Level) String() string { return [...]string{"INFO", "WARN", "ERROR"}[l] }

// Logger writes records to one writer, a whole line at a time.
type Logger struct {
	mu   sync.Mutex
	w    io.Writer
	json bool
	// Now is the records' clock; nil leaves the time out (tests).
	Now func() time.Time
	buf []byte
}

// New returns a logger writing text records to w, or JSON ones.
func New(w io.Writer, json bool) *Logger { return &Logger{w: w, json: json, Now: time.Now} }

// Info, Warn and Error log msg with key/value pairs (kv: a string key,
// then its value: a string, an int, an error or a fmt.Stringer).
func (l *Logger) Info(msg string, kv ...any)  { l.Log(Info, msg, kv...) }
func (l *Logger) Warn(msg string, kv ...any)  { l.Log(Warn, msg, kv...) }
func (l *Logger) Error(msg string, kv ...any) { l.Log(Error, msg, kv...) }

// Log writes one record at level.
func (l *Logger) Log(level Level, msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buf[:0]
	if l.json {
		b = append(b, '{')
	}
	first := true
	if l.Now != nil {
		b = l.field(b, first, "time", l.Now().Format("2006-01-02T15:04:05.000Z07:00"))
		first = false
	}
	b = l.field(b, first, "level", level.String())
	b = l.field(b, false, "msg", msg)
	for i := 0; i+1 < len(kv); i += 2 {
		k, _ := kv[i].(string)
		b = l.field(b, false, k, kv[i+1])
	}
	if l.json {
		b = append(b, '}')
	}
	b = append(b, '\n')
	l.buf = b
	_, _ = l.w.Write(b)
}

// field appends key=value (text) or "key":value (JSON).
func (l *Logger) field(b []byte, first bool, key string, v any) []byte {
	if !first {
		if l.json {
			b = append(b, ',')
		} else {
			b = append(b, ' ')
		}
	}
	if l.json {
		b = appendJSONString(b, key)
		b = append(b, ':')
		if n, ok := v.(int); ok {
			return strconv.AppendInt(b, int64(n), 10)
		}
		return appendJSONString(b, text(v))
	}
	b = appendText(b, key)
	b = append(b, '=')
	if n, ok := v.(int); ok {
		return strconv.AppendInt(b, int64(n), 10)
	}
	return appendText(b, text(v))
}

// text is a value as a string.
func text(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case error:
		return v.Error()
	case interface{ String() string }:
		return v.String()
	case int64:
		return strconv.FormatInt(v, 10)
	case bool:
		return strconv.FormatBool(v)
	case nil:
		return "<nil>"
	}
	return "!BADVALUE"
}

// appendText appends s as slog's text handler does: bare when it can be
// read back so, else quoted.
func appendText(b []byte, s string) []byte {
	if needsQuoting(s) {
		return strconv.AppendQuote(b, s)
	}
	return append(b, s...)
}

// needsQuoting reports whether s must be quoted in a text record: it is
// empty, or holds a space, '=', '"', a control or other unprintable rune.
func needsQuoting(s string) bool {
	if s == "" {
		return true
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c == ' ' || c == '=' || c == '"' || c < 0x20 || c == 0x7f {
				return true
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return true
		}
		i += n
	}
	return false
}

// appendJSONString appends s as a JSON string, as slog's JSON handler
// writes one: quotes, backslashes and control bytes escaped, the rest
// (HTML characters too) as is; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}

// Writer is w for a *log.Logger (an HTTP server's errors): each write is
// logged as a record's message at level, its final newline dropped.
func (l *Logger) Writer(level Level) io.Writer { return levelWriter{l, level} }

type levelWriter struct {
	l     *Logger
	level Level
}

func (w levelWriter) Write(p []byte) (int, error) {
	msg := string(p)
	if n := len(msg); n > 0 && msg[n-1] == '\n' {
		msg = msg[:n-1]
	}
	w.l.Log(w.level, msg)
	return len(p), nil
}
