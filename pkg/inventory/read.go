package inventory

import (
	"errors"
	"io"
	"os/exec"

	"github.com/portmap-dev/portmap/pkg/backend/iptables"
	"github.com/portmap-dev/portmap/pkg/backend/nftables"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Read returns the host-port table of this host: both backends, both
// families. A backend whose tool is not installed contributes nothing.
func Read() ([]Entry, error) {
	var all []Entry
	var errs []error
	for _, f := range plan.Families {
		ipt, err := ReadIPTables(f)
		errs = append(errs, err)
		nft, err := ReadNFTables(f)
		errs = append(errs, err)
		all = append(append(all, ipt...), nft...)
	}
	Sort(all)
	return all, errors.Join(errs...)
}

// ReadIPTables reads the nat table of family f.
func ReadIPTables(f plan.Family) ([]Entry, error) {
	b, err := iptables.New(f)
	if errors.Is(err, exec.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	fs, err := b.Forwards()
	return FromForwards(fs, "iptables"), err
}

// ReadNFTables reads our nftables table of family f.
func ReadNFTables(f plan.Family) ([]Entry, error) {
	b, err := nftables.New(f, io.Discard)
	if errors.Is(err, exec.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	fs, err := b.Forwards()
	return FromForwards(fs, "nftables"), err
}
