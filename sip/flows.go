package sip

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
)

// flowConn is a client connection a request can be sent back over (RFC
// 5626 flows): accepted TCP connections here, TLS and WebSocket ones
// where those listeners are served. Every one is registered in the
// server's flowTable for its life, under an id its flow token names.
type flowConn interface {
	// send writes one serialized message; it must not block on a peer
	// that does not read.
	send(msg []byte) error
	// id is the connection's id in the flow table, never 0.
	id() uint64
	// transport is the Via transport of the connection: "TCP", "TLS",
	// "WS" or "WSS".
	transport() string
	// listener is the index of the listener it came in on
	// (listenerMain for the UDP/TCP port).
	listener() uint8
	// peer is the client's address: where responses on the flow come
	// from, which our branch MAC names.
	peer() netip.AddrPort
}

// listenerMain is the listener index of the UDP/TCP port (Config.Listen).
const listenerMain uint8 = 0

// flowTable is the registry of the client connections of this node by id.
// Ids come from one counter and are never reused while the table lives;
// gen, drawn at random, tells this table's ids from those of an earlier
// process. Safe for concurrent use.
type flowTable struct {
	gen  uint32
	next atomic.Uint64

	mu    sync.RWMutex
	m     map[uint64]flowConn
	peak  int
	count atomic.Int64
}

func (ft *flowTable) init() {
	var b [4]byte
	_, _ = rand.Read(b[:])
	ft.gen = binary.BigEndian.Uint32(b[:])
	ft.m = map[uint64]flowConn{}
}

// newID returns a connection id no other connection of this table had.
func (ft *flowTable) newID() uint64 { return ft.next.Add(1) }

// add registers c under c.id().
func (ft *flowTable) add(c flowConn) {
	ft.mu.Lock()
	ft.m[c.id()] = c
	ft.peak = max(ft.peak, len(ft.m))
	ft.mu.Unlock()
	ft.count.Add(1)
}

// remove unregisters c (nothing when another connection holds its id,
// which cannot happen, or it was not registered).
func (ft *flowTable) remove(c flowConn) {
	ft.mu.Lock()
	if ft.m[c.id()] == c {
		delete(ft.m, c.id())
		ft.count.Add(-1)
	}
	// A Go map never gives back its buckets: after a wave of connections,
	// copy the survivors into a map of their own size (as tcpTable does).
	if ft.peak >= 1024 && len(ft.m) < ft.peak/8 {
		m := make(map[uint64]flowConn, len(ft.m))
		for k, v := range ft.m {
			m[k] = v
		}
		ft.m, ft.peak = m, len(m)
	}
	ft.mu.Unlock()
}

// lookup returns the live connection r names on node, or nil: another
// node's token, an earlier generation's, a connection that is gone, or
// one of another listener.
func (ft *flowTable) lookup(r flowRef, node uint32) flowConn {
	if r.node != node || r.gen != ft.gen {
		return nil
	}
	ft.mu.RLock()
	c := ft.m[r.conn]
	ft.mu.RUnlock()
	if c == nil || c.listener() != r.listener {
		return nil
	}
	return c
}

// Len returns the number of registered flows.
func (ft *flowTable) Len() int { return int(ft.count.Load()) }

// The connections accepted on the main listener (TCP) and on the TLS, WS
// and WSS listeners are flows; the listener index is the connection's
// kind (send is in stream.go: it frames for the protocol).

func (c *tcpConn) id() uint64           { return c.fid }
func (c *tcpConn) transport() string    { return c.kind.String() }
func (c *tcpConn) listener() uint8      { return uint8(c.kind) } // listenerMain for TCP
func (c *tcpConn) peer() netip.AddrPort { return c.remote }

// flow returns the client flow a message came on, nil for UDP and for
// connections sluice dialled.
func (src source) flow() flowConn {
	if src.conn == nil || src.conn.fid == 0 {
		return nil
	}
	return src.conn
}

// flowNode is this node's id in flow tokens: a hash of its advertised
// address, which every node of a cluster has its own of.
func (s *Server) flowNode() uint32 {
	h := fnv64(fnvOffset, s.adv.host)
	h = (h ^ uint64(s.adv.port)) * 1099511628211
	return uint32(h ^ h>>32)
}

// flowToken returns the token naming flow f of this node.
func (s *Server) flowToken(f flowConn) string {
	return s.flowSign.encode(flowRef{node: s.flowNode(), listener: f.listener(), gen: s.flows.gen, conn: f.id()})
}
