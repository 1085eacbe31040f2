//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package demo

import "errors"

var errNoMapping = errors.New("anonymous mappings not supported on this platform")

// mapMemory always fails here: held memory comes from the Go heap.
func mapMemory(int) ([]byte, error) { return nil, errNoMapping }

func unmapMemory([]byte) {}
