package nft

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// ErrRefused marks nft refusing a script (exit status 1): nft reports the
// kernel's errno as text only.
var ErrRefused = errors.New("refused")

// Installed says why nft cannot run, or nil.
func Installed() error {
	_, err := exec.LookPath("nft")
	return err
}

// RunScript feeds an nft script to nft -f; without commit, to nft
// --check, which has the kernel check it and commit nothing.
func RunScript(script string, commit bool) error {
	path, err := exec.LookPath("nft")
	if err != nil {
		return &Error{Op: "nft -f", Err: err}
	}
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
			err = fmt.Errorf("%w (%w)", err, ErrRefused)
		}
		return &Error{Op: "nft -f", Err: fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))}
	}
	return nil
}
