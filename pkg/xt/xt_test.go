package xt

import (
	"slices"
	"testing"
)

// QuoteArgs quotes what iptables-restore would split or take for a
// comment, and SplitRule reads it back.
func TestQuoteArgsAndSplitRule(t *testing.T) {
	tests := []struct{ in, want string }{
		{"-d", "-d"},
		{"192.0.2.0/24", "192.0.2.0/24"},
		{"a b", `"a b"`},
		{"", `""`},
		{`dnat name: "n" id: "c"`, `"dnat name: \"n\" id: \"c\""`},
		{`back\slash`, `"back\\slash"`},
	}
	for _, tt := range tests {
		if got := QuoteArgs([]string{tt.in}); got != tt.want {
			t.Errorf("QuoteArgs(%q) = %s, want %s", tt.in, got, tt.want)
		}
		if got := SplitRule("-A X " + QuoteArgs([]string{tt.in, "-j", "ACCEPT"})); !slices.Equal(got, []string{"-A", "X", tt.in, "-j", "ACCEPT"}) {
			t.Errorf("SplitRule of %q quoted: %q", tt.in, got)
		}
	}
}

// A rule's table is NAT unless it names one; JumpOf finds -j and -g.
func TestRuleTableAndJump(t *testing.T) {
	if got := (Rule{}).TableName(); got != NAT {
		t.Errorf("TableName of a rule without one: %q", got)
	}
	if got := (Rule{Table: Filter}).TableName(); got != Filter {
		t.Errorf("TableName of a filter rule: %q", got)
	}
	for _, tt := range []struct {
		tokens []string
		want   string
	}{{[]string{"-p", "tcp", "-j", "DNAT"}, "DNAT"}, {[]string{"-g", "CNI-DN-1"}, "CNI-DN-1"}, {[]string{"-p", "tcp"}, ""}, {[]string{"-j"}, ""}} {
		if got := JumpOf(tt.tokens); got != tt.want {
			t.Errorf("JumpOf(%q) = %q, want %q", tt.tokens, got, tt.want)
		}
	}
}
