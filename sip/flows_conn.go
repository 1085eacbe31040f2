package sip

import (
	"errors"
	"sync"
	"sync/atomic"
)

// Every accepted client connection (TCP, TLS, WS, WSS) has a flow id,
// unique for the life of the process and never reused, under which a
// message can be sent back to that very connection: what a flow token
// names (RFC 5626), since a WebSocket client's Via and Contact name an
// address nobody can reach (RFC 7118 §5.2).

// flowConn is what the flow table needs of a connection.
type flowConn interface {
	// send writes one SIP message in the connection's protocol without
	// blocking on the peer.
	send(p []byte) error
}

// errFlowGone: the connection a flow id named is closed.
var errFlowGone = errors.New("sip flow gone: its connection is closed")

// flowTable maps flow ids to live accepted connections.
type flowTable struct {
	next  atomic.Uint64
	mu    sync.RWMutex
	conns map[uint64]flowConn
	peak  int
}

// newID is a flow id never given before; a connection gets it before
// anyone else can see the connection.
func (f *flowTable) newID() uint64 { return f.next.Add(1) }

// add registers c under its id.
func (f *flowTable) add(c *tcpConn) {
	f.mu.Lock()
	if f.conns == nil {
		f.conns = map[uint64]flowConn{}
	}
	f.conns[c.id] = c
	f.peak = max(f.peak, len(f.conns))
	f.mu.Unlock()
}

// remove takes c out, once it is closing.
func (f *flowTable) remove(c *tcpConn) {
	if c.id == 0 {
		return
	}
	f.mu.Lock()
	delete(f.conns, c.id)
	// A Go map never gives back its buckets: after a wave of thousands
	// of connections, copy the survivors into a map of their own size.
	if f.peak >= 1024 && len(f.conns) < f.peak/8 {
		m := make(map[uint64]flowConn, len(f.conns))
		for k, v := range f.conns {
			m[k] = v
		}
		f.conns, f.peak = m, len(m)
	}
	f.mu.Unlock()
}

// get returns the connection of flow id, nil when gone.
func (f *flowTable) get(id uint64) flowConn {
	f.mu.RLock()
	c := f.conns[id]
	f.mu.RUnlock()
	return c
}

// len is the number of live flows.
func (f *flowTable) len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.conns)
}

// flowSend sends msg on the connection of flow id, in its protocol
// (framed for WebSocket, in TLS records for TLS), without blocking on the
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

// flowOf is the flow id of the connection src came on; 0 for UDP and for
// connections sluice dialled.
func flowOf(src source) uint64 {
	if src.conn == nil {
		return 0
	}
	return src.conn.id
}
