package nftables

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// nftPresent says why rules holding conditions cannot be written, or nil.
func nftPresent() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("conditionsV4/V6 are nft syntax, compiled by nft: %w", err)
	}
	return nil
}

// runNft feeds a script to nft: for rules holding conditions.
func runNft(script string, commit bool) error {
	if err := nftPresent(); err != nil {
		return err
	}
	path, _ := exec.LookPath("nft")
	args := []string{"-f", "-"}
	if !commit {
		args = []string{"--check", "-f", "-"}
	}
	cmd := exec.Command(path, args...)
	cmd.Stdin = strings.NewReader(script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 {
			err = fmt.Errorf("%w (%w)", err, ErrNftRefused)
		}
		return &Error{Op: "nft -f", Err: fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))}
	}
	return nil
}

// ErrNftRefused marks nft refusing a script (exit status 1): nft reports
// the kernel's errno as text only, so a fast path holding conditions
// treats any refusal as the expected kind.
var ErrNftRefused = errors.New("refused")
