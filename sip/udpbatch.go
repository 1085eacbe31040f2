package sip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// The UDP datagrams produced while the reader handles one batch of
// datagrams read together (relayed requests and responses, our own 100
// Trying and local answers) are queued and leave with one sendmmsg at the
// end of the batch (-sip-udp-send-batch): one system call and one wake-up
// of each receiver for the batch instead of one per datagram. A batch of
// one datagram is not queued: what it produces leaves at once, so a
// lightly loaded balancer adds no latency.
//
// Order: while a batch is open every UDP send of the server, from any
// goroutine (the reader, the timers, TCP readers relaying to UDP peers),
// joins one queue in the order it was made, and the queue leaves in that
// order; a send that needs its result at once (sendBytes) sends the queue
// before it. So two messages to one destination leave in the order they
// were produced (a 100 Trying, then the 180 relayed after it), whichever
// goroutines produced them.
//
// Errors: a UDP send on an unconnected socket fails only for reasons of
// its own (no route, a firewall, a destination of the other address
// family); sendmmsg stops at a message that fails, so each message gets
// its own result. A send whose failure changes what happens next (new work
// to a backend: failover; an in-dialog request: 503 to the client) passes
// the handler of that failure, called after the batch with the message's
// error; the counters of sent messages (Relayed, Forwarded, LocalReplies)
// count the messages that left.

// udpOut is the send queue of the UDP socket.
type udpOut struct {
	w    batchWriter
	open atomic.Bool // a read batch is being handled: sends queue

	mu    sync.Mutex
	arena []byte // the queued datagrams, back to back
	q     []udpQueued
	ms    []ipv4.Message
	addrs []net.UDPAddr
	ips   [][16]byte
	bufs  [][1][]byte
	fails []udpFailed
	// held are the dialog records of the first 2xx queued in this batch
	// (relayConfirmed), committed with one CommitDialogs of heldGC before
	// any of the queue leaves: no 2xx leaves before its record.
	held   []StoredDialog
	heldGC *dialogCommit
}

// batchWriter sends messages with sendmmsg where the system has it
// (ipv4.PacketConn and ipv6.PacketConn; their Message types are one).
type batchWriter interface {
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// udpQueued is one queued datagram: arena[off:end] to dst.
type udpQueued struct {
	off, end int
	dst      netip.AddrPort
	ok       *atomic.Uint64  // counted when the datagram left
	onErr    func(err error) // called after the flush when it did not
	errp     *error          // set to the error when it did not (sendBytes)
}

// udpFailed is a queued datagram that did not leave and its error.
type udpFailed struct {
	onErr func(err error)
	err   error
}

// Bounds of one queue: past either it is sent at once, so the queue of a
// batch (whatever its datagrams make the server send) stays bounded.
const (
	udpOutMaxMsgs  = 64
	udpOutMaxBytes = 1 << 20
)

// newUDPOut returns the send queue of c: with raw sends (raw not nil) raw
// sendmmsg calls (udpio_linux.go), else ipv6's batch writer for an IPv6
// (dual-stack) socket, ipv4's otherwise.
func newUDPOut(c *net.UDPConn, raw *udpRaw) *udpOut {
	w := newRawBatch(raw)
	if w != nil {
		return &udpOut{w: w}
	}
	if la, ok := c.LocalAddr().(*net.UDPAddr); ok && la.IP.To4() == nil {
		w = ipv6.NewPacketConn(c)
	} else {
		w = ipv4.NewPacketConn(c)
	}
	return &udpOut{w: w}
}

// begin opens a batch: UDP sends queue until end.
func (o *udpOut) begin() { o.open.Store(true) }

// end sends what the batch queued and closes it; then it calls the
// failure handlers of the datagrams that did not leave. Only end calls
// them, on the reader's goroutine holding no lock: a send may be queued
// under the transaction table's lock, which a handler takes.
func (o *udpOut) end(s *Server) {
	o.mu.Lock()
	o.flushLocked(s)
	o.open.Store(false)
	fails := o.takeFailsLocked()
	o.mu.Unlock()
	runFails(fails)
}

// queue adds p to dst to the open batch; false when no batch is open (the
// caller sends it itself). p is copied.
func (o *udpOut) queue(s *Server, p []byte, dst netip.AddrPort, ok *atomic.Uint64, onErr func(error)) bool {
	if !o.open.Load() {
		return false
	}
	o.mu.Lock()
	if !o.open.Load() {
		o.mu.Unlock()
		return false
	}
	o.addLocked(p, dst, ok, onErr, nil)
	if len(o.q) >= udpOutMaxMsgs || len(o.arena) >= udpOutMaxBytes {
		o.flushLocked(s) // failure handlers wait for end
	}
	o.mu.Unlock()
	return true
}

// sendNow sends the open batch's queue and then p to dst, all with one
// sendmmsg, and returns p's result; handled is false when no batch is
// open (the caller sends p itself).
func (o *udpOut) sendNow(s *Server, p []byte, dst netip.AddrPort) (handled bool, err error) {
	if !o.open.Load() {
		return false, nil
	}
	o.mu.Lock()
	if !o.open.Load() {
		o.mu.Unlock()
		return false, nil
	}
	var res error
	o.addLocked(p, dst, nil, nil, &res)
	o.flushLocked(s) // failure handlers of the others wait for end
	o.mu.Unlock()
	return true, res
}

func (o *udpOut) addLocked(p []byte, dst netip.AddrPort, ok *atomic.Uint64, onErr func(error), errp *error) {
	off := len(o.arena)
	o.arena = append(o.arena, p...)
	o.q = append(o.q, udpQueued{off: off, end: len(o.arena), dst: dst, ok: ok, onErr: onErr, errp: errp})
}

// queueHeld adds p, the first 2xx of the dialog of rec, to the open batch
// and rec to the records the batch commits with gc before its queue
// leaves; false when no batch is open (the caller holds it as before).
func (o *udpOut) queueHeld(s *Server, gc *dialogCommit, rec StoredDialog, p []byte, dst netip.AddrPort) bool {
	if !o.open.Load() {
		return false
	}
	o.mu.Lock()
	if !o.open.Load() {
		o.mu.Unlock()
		return false
	}
	if o.heldGC != gc {
		o.commitLocked(s) // the store was replaced: the old one's records first
		o.heldGC = gc
	}
	o.held = append(o.held, rec)
	o.addLocked(p, dst, &s.metrics.Relayed, nil, nil)
	if len(o.q) >= udpOutMaxMsgs || len(o.arena) >= udpOutMaxBytes {
		o.flushLocked(s)
	}
	o.mu.Unlock()
	return true
}

// commitLocked hands the batch's held records to their committer in one
// call (serialized with commitHeld's calls by the committer's commitMu).
func (o *udpOut) commitLocked(s *Server) {
	n := len(o.held)
	if n == 0 {
		return
	}
	gc := o.heldGC
	ok := gc.commit(o.held)
	if !ok {
		s.metrics.DialogStoreUnsafe.Add(uint64(n))
	}
	s.metrics.DialogStoreHeld.Add(uint64(n))
	clear(o.held)
	o.held = o.held[:0]
}

// takeFailsLocked returns the failure handlers to call and empties the
// list (the returned slice is the caller's).
func (o *udpOut) takeFailsLocked() []udpFailed {
	if len(o.fails) == 0 {
		return nil
	}
	f := o.fails
	o.fails = nil
	return f
}

func runFails(fails []udpFailed) {
	for _, f := range fails {
		f.onErr(f.err)
	}
}

// errNoProgress is a batch write that sent nothing and said nothing.
var errNoProgress = errors.New("sendmmsg sent no message")

// flushLocked sends the queue in order with as few sendmmsg calls as the
// results allow: a call stops at a message that fails, which gets that
// error, and the next call starts after it.
func (o *udpOut) flushLocked(s *Server) {
	o.commitLocked(s)
	n := len(o.q)
	if n == 0 {
		return
	}
	for len(o.addrs) < n {
		o.addrs = append(o.addrs, net.UDPAddr{})
		o.ips = append(o.ips, [16]byte{})
		o.bufs = append(o.bufs, [1][]byte{})
	}
	o.ms = o.ms[:0]
	for i := range o.q {
		e := &o.q[i]
		a := e.dst.Addr()
		ua := &o.addrs[i]
		if a.Is4() {
			b := a.As4()
			copy(o.ips[i][:4], b[:])
			ua.IP = o.ips[i][:4]
		} else {
			o.ips[i] = a.As16()
			ua.IP = o.ips[i][:]
		}
		ua.Port, ua.Zone = int(e.dst.Port()), a.Zone()
		o.bufs[i][0] = o.arena[e.off:e.end]
		o.ms = append(o.ms, ipv4.Message{Buffers: o.bufs[i][:], Addr: ua})
	}
	for i := 0; i < n; {
		sent, err := o.w.WriteBatch(o.ms[i:n], 0)
		if sent < 0 || sent > n-i {
			sent = 0
		}
		for j := i; j < i+sent; j++ {
			if c := o.q[j].ok; c != nil {
				c.Add(1)
			}
		}
		i += sent
		if i == n {
			break
		}
		if err == nil {
			if sent > 0 {
				continue // stopped short of a message that fails: the next call says why
			}
			err = errNoProgress
		}
		o.failLocked(s, &o.q[i], err)
		i++
	}
	for i := range o.ms {
		o.ms[i] = ipv4.Message{}
	}
	for i := range n {
		o.addrs[i] = net.UDPAddr{}
		o.bufs[i][0] = nil
		o.q[i] = udpQueued{}
	}
	o.q, o.ms = o.q[:0], o.ms[:0]
	if cap(o.arena) > 2*udpOutMaxBytes {
		o.arena = nil // one very large datagram: not kept
	} else {
		o.arena = o.arena[:0]
	}
}

// failLocked records that e did not leave.
func (o *udpOut) failLocked(s *Server, e *udpQueued, err error) {
	s.metrics.SendErrors.Add(1)
	err = fmt.Errorf("send udp %s: %w", e.dst, err)
	if e.errp != nil {
		*e.errp = err
	}
	if e.onErr != nil {
		o.fails = append(o.fails, udpFailed{onErr: e.onErr, err: err})
	}
}
