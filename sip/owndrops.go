package sip

import (
	"sync/atomic"

	"github.com/sluicelb/sluice/lb"
)

// A datagram dropped at sluice's own UDP socket (its receive queue full:
// sluice, not the backend, fell behind) can be a backend's answer. A
// transaction that then times out, or an in-dialog request left
// unanswered, is not evidence against that backend: charged to it, the
// overload of the balancer ejected a healthy backend, the other backends
// took its share and fell behind in turn (RELIABILITY.md 3l: a whole run
// of calls failed that way). So the timer goroutine reads the socket's
// drop count every tick (SO_MEMINFO on Linux), and a timeout whose
// request was sent at or before drops were last seen goes to the backend
// as Abandoned, not Timeout; the failover and the 408 happen as before.

// ownDrops is the UDP socket's receive drops as the timer goroutine saw
// them.
type ownDrops struct {
	// read returns the socket's drop count since it was made; nil reads
	// the UDP socket (udpdrops_*.go). Tests set it.
	read atomic.Pointer[func() (uint32, bool)]
	prev uint32 // the count at the last tick (timer goroutine only)
	seen bool   // prev was read once
	// at is the clock's time of the tick that last saw the count grow;
	// 0: never.
	at atomic.Int64
	// logged is the Metrics.OwnDrops value of the last warning.
	logged uint64
}

// noteOwnDrops reads the socket's drop count at tick time now.
func (s *Server) noteOwnDrops(now int64) {
	d := &s.ownDrops
	var n uint32
	var ok bool
	if read := d.read.Load(); read != nil {
		n, ok = (*read)()
	} else if s.udp != nil {
		n, ok = udpDrops(s.udp)
	}
	if !ok {
		return
	}
	if d.seen && n != d.prev {
		s.metrics.OwnDrops.Add(uint64(n - d.prev)) // uint32 wraps with the kernel's
		d.at.Store(now)
	}
	d.prev, d.seen = n, true
}

// ownDropsSince reports whether the socket was seen dropping at or after
// sent (a time of the clock): an answer to what was sent then may have
// been among the drops.
func (s *Server) ownDropsSince(sent int64) bool {
	at := s.ownDrops.at.Load()
	return at != 0 && at >= sent
}

// timeoutResult is what a timeout of a request sent at sent tells the
// backend's passive health: Timeout, or Abandoned when the balancer's own
// socket dropped datagrams since (counted: TimeoutsOwnDrops).
func (s *Server) timeoutResult(sent int64) lb.Result {
	if s.ownDropsSince(sent) {
		s.metrics.TimeoutsOwnDrops.Add(1)
		return lb.Abandoned
	}
	return lb.Timeout
}

// logOwnDrops warns, at most once per call (the timer goroutine calls it
// every 10 s), when the socket dropped datagrams since the last warning.
func (s *Server) logOwnDrops() {
	d := &s.ownDrops
	n := s.metrics.OwnDrops.Load()
	if n == d.logged {
		return
	}
	s.log.Warn("sip UDP socket dropped datagrams: its receive queue was full (sluice fell behind, not the backends); timeouts meanwhile are not charged to backends: give sluice more CPU or raise -sip-udp-buffer",
		"dropped_total", n, "since_last", n-d.logged, "timeouts_not_charged_total", s.metrics.TimeoutsOwnDrops.Load())
	d.logged = n
}
