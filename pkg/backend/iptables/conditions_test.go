package iptables

import "testing"

func TestBadConditionToken(t *testing.T) {
	for tok, bad := range map[string]bool{
		"!": false, "-d": false, "10.1.0.0/16": false, "--dport": false,
		"": true, "-j": true, "-A": true, "--goto": true, "1.2.3.4\n-A": true, `a"b`: true, "x;y": true,
	} {
		if got := BadConditionToken(tok) != ""; got != bad {
			t.Errorf("BadConditionToken(%q) refuses: %v, want %v", tok, got, bad)
		}
	}
}
