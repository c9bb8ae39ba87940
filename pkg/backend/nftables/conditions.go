package nftables

import (
	"fmt"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

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
		if nft.IsStatement(word) {
			return fmt.Sprintf("holds the statement %q: conditions may only add matches", word)
		}
	}
	return ""
}
