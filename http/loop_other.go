//go:build !linux

package http

import (
	"context"
	"errors"
	"net"
)

const (
	loopSupported = false
	// DefaultEngine is the engine Config.Engine "" means on this platform.
	DefaultEngine = EngineFastHTTP
)

type loopEngine struct{}

// serveLoops fails: the loop engine needs epoll (Config.Validate refuses it first).
func (s *Server) serveLoops(net.Listener, *tlsFront) error {
	return errors.New("http: the loop engine needs Linux")
}

// fdLimit is a stand-in for the descriptor limit where it is not read.
func fdLimit() uint64 { return 1 << 16 }

// slotFreed has no loop to tell.
func (e *loopEngine) slotFreed(string) {}

// shutdown has nothing to stop.
func (e *loopEngine) shutdown(context.Context) error { return nil }
