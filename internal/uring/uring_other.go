//go:build !linux

package uring

import "errors"

// Completion is the result of one queued operation (see the Linux build).
type Completion struct {
	User uint64
	Res  int32
}

// Ring is not available off Linux.
type Ring struct{}

// New fails: io_uring is Linux's.
func New(entries uint32) (*Ring, error) { return nil, errors.New("uring: io_uring needs Linux") }
