package sip

import "errors"

// flowSend and errFlowGone give the flows of the flow table (flows.go) a
// send by id: a message written to that very connection in its protocol
// (framed for WebSocket, in TLS records for TLS).

// errFlowGone: the connection a flow id named is closed.
var errFlowGone = errors.New("sip flow gone: its connection is closed")

// get returns the live connection of id, nil when gone.
func (ft *flowTable) get(id uint64) flowConn {
	ft.mu.RLock()
	c := ft.m[id]
	ft.mu.RUnlock()
	return c
}

// flowSend sends msg on the connection of flow id without blocking on the
// peer. errFlowGone when the connection is closed: the caller answers
// 430 Flow Failed (RFC 5626 §5.3).
func (s *Server) flowSend(id uint64, msg []byte) error {
	c := s.flows.get(id)
	if c == nil {
		return errFlowGone
	}
	if err := c.send(msg); err != nil {
		s.metrics.SendErrors.Add(1)
		return err
	}
	return nil
}
