package nft

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/portmap-dev/portmap/pkg/child"
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
	cmd := child.Command(path, args...)
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

// statements are nft words that start a statement or a command rather
// than a match.
var statements = map[string]bool{
	"accept": true, "drop": true, "reject": true, "jump": true, "goto": true, "return": true,
	"queue": true, "continue": true, "dnat": true, "snat": true, "masquerade": true,
	"redirect": true, "set": true, "log": true, "counter": true, "limit": true, "quota": true,
	"notrack": true, "tproxy": true, "dup": true, "fwd": true, "add": true, "update": true,
	"delete": true, "flush": true, "insert": true, "replace": true, "create": true,
	"table": true, "chain": true, "rule": true, "comment": true, "vmap": true,
}

// IsStatement reports whether word (any case) starts a statement or a
// command rather than a match: match text holding one could drop, accept
// or rewrite traffic instead of selecting it.
func IsStatement(word string) bool { return statements[strings.ToLower(word)] }
