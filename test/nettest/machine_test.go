package nettest

import "testing"

func TestChanged(t *testing.T) {
	for _, c := range []struct{ before, after, want string }{
		{"a\nb\n", "a\nb\n", ""},
		{"a\nb\n", "a\nc\n", "+ c\n- b\n"},
		{"a\n", "a\na\n", "+ a\n"},
		{"a\nb", "b\na", "before:\na\nbafter:\nb\na"},
	} {
		if got := Changed(c.before, c.after); got != c.want {
			t.Errorf("Changed(%q, %q) = %q, want %q", c.before, c.after, got, c.want)
		}
	}
}
