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

func (s *Server) serveLoops(net.Listener) error {
	return errors.New("http: the loop engine needs Linux")
}

func (e *loopEngine) shutdown(context.Context) error { return nil }
