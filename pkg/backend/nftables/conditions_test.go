package nftables

import "testing"

func TestBadConditionToken(t *testing.T) {
	for tok, bad := range map[string]bool{
		"ip daddr != 10.1.0.0/16": false, "iifname \"eth0\"": false,
		"": true, " ": true, "ip saddr 1.2.3.4 accept": true, "ip saddr 1.2.3.4; flush ruleset": true,
		"tcp dport 1 # x": true, "meta mark set 1": true, "a\nb": true,
	} {
		if got := BadConditionToken(tok) != ""; got != bad {
			t.Errorf("BadConditionToken(%q) refuses: %v, want %v", tok, got, bad)
		}
	}
}
