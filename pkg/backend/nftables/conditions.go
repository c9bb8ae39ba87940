package nftables

import (
	"fmt"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// nftStatements are nft words that start a statement or a command rather
// than a match: a condition holding one could drop, accept or rewrite
// traffic instead of selecting it.
var nftStatements = map[string]bool{
	"accept": true, "drop": true, "reject": true, "jump": true, "goto": true, "return": true,
	"queue": true, "continue": true, "dnat": true, "snat": true, "masquerade": true,
	"redirect": true, "set": true, "log": true, "counter": true, "limit": true, "quota": true,
	"notrack": true, "tproxy": true, "dup": true, "fwd": true, "add": true, "update": true,
	"delete": true, "flush": true, "insert": true, "replace": true, "create": true,
	"table": true, "chain": true, "rule": true, "comment": true, "vmap": true,
}

// BadConditionToken says why tok cannot be part of conditionsV4/V6 for
// this backend — nft match text prepended to the attachment's rules — or
// "" when it can: a statement (a verdict, a NAT, a set update) or text
// that would end the rule or the script is refused.
func BadConditionToken(tok string) string {
	if strings.TrimSpace(tok) == "" {
		return "must not be empty"
	}
	if plan.HasControl(tok) {
		return "must not contain control characters such as newlines"
	}
	if strings.ContainsAny(tok, `;#\`) {
		return "must not contain ';', '#' or backslashes"
	}
	for _, word := range strings.Fields(tok) {
		if nftStatements[strings.ToLower(word)] {
			return fmt.Sprintf("holds the statement %q: conditions may only add matches", word)
		}
	}
	return ""
}
