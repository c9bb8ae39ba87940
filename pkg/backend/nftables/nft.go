package nftables

import (
	"fmt"

	"github.com/portmap-dev/portmap/pkg/nft"
)

// nftPresent says why rules holding conditions cannot be written, or nil.
func nftPresent() error {
	if err := nft.Installed(); err != nil {
		return fmt.Errorf("conditionsV4/V6 are nft syntax, compiled by nft: %w", err)
	}
	return nil
}

// runNft feeds a script to nft: for rules holding conditions.
func runNft(script string, commit bool) error {
	if err := nftPresent(); err != nil {
		return err
	}
	return nft.RunScript(script, commit)
}
