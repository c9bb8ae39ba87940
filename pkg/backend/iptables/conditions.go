package iptables

import (
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// forbiddenTokens are iptables options that are not matches: commands that
// would make the entry rule something else, and targets that would end it.
var forbiddenTokens = map[string]bool{
	"-A": true, "--append": true, "-I": true, "--insert": true, "-D": true, "--delete": true,
	"-R": true, "--replace": true, "-N": true, "--new-chain": true, "-X": true, "--delete-chain": true,
	"-F": true, "--flush": true, "-Z": true, "--zero": true, "-P": true, "--policy": true,
	"-E": true, "--rename-chain": true, "-C": true, "--check": true, "-L": true, "--list": true,
	"-S": true, "--list-rules": true, "-t": true, "--table": true,
	"-j": true, "--jump": true, "-g": true, "--goto": true,
}

// BadConditionToken says why tok cannot be one token of conditionsV4/V6
// for this backend — an iptables match token added to the entry rule — or
// "" when it can: a token that ends the rule, starts another command or
// jumps is refused, and so is anything the restore payload's quoting
// could not carry.
func BadConditionToken(tok string) string {
	if tok == "" {
		return "must not be empty"
	}
	if plan.HasControl(tok) {
		return "must not contain control characters such as newlines"
	}
	if strings.ContainsAny(tok, `;"'\`) {
		return "must not contain ';', quotes or backslashes"
	}
	if forbiddenTokens[tok] {
		return "is not a match: conditions may only add matches to the entry rule"
	}
	return ""
}
