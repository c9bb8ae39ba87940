package nft

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Error is a failed read or write of nf_tables: what it was, and why.
type Error struct {
	Op  string
	Err error
}

func (e *Error) Error() string { return e.Op + ": " + e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// IsNotFound reports whether err says that an object (a table, a chain, a
// map element) does not exist.
func IsNotFound(err error) bool { return errors.Is(err, unix.ENOENT) }
