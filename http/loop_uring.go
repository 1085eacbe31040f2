//go:build linux

package http

// The loop engine's batched writes (Config.IOURing, -http-io-uring): the
// bytes a round of events has for plain clients (answers) and for
// backends (requests) go out together at the end of the round, as SEND
// operations on one io_uring, in one io_uring_enter instead of a write(2)
// each. On a machine where a system call's entry and exit cost more than
// the loopback TCP work of a small write (a paravirtualised guest), that
// is most of a write's cost (internal/uring's benchmark).
//
// Nothing else changes: a client's answer bytes wait in c.out exactly as
// they do for a client that is slow to read (c.o < len(c.out)), so every
// path that pauses for a slow client (relay, endRequest, clientIn, drain)
// pauses until the round's end; the completion of a send is then handled
// as write(2)'s result: bytes taken advance c.o or bc.pend and the rest is
// written at once by the plain path (flushClient, writeBackend), which
// also resumes what waited; EAGAIN waits for the next EPOLLOUT edge; an
// error closes as today. The sends carry MSG_DONTWAIT, so the kernel never
// holds one back for readiness: all complete within the io_uring_enter.
// HTTPS connections and tunnels keep the plain path, and so does a write
// when the round has more than the ring holds.

import (
	"errors"

	"github.com/sluicelb/sluice/internal/uring"
	"golang.org/x/sys/unix"
)

// ringEntries is the most sends of one io_uring_enter; a round with more
// writes the rest with write(2).
const ringEntries = 256

// maxPooledOut is the largest answer buffer a loop keeps for reuse once
// its bytes are out; larger ones (a slow reader of a large answer) go.
const maxPooledOut = 64 << 10

// ioTarget is the connection a queued send writes to, as it was when
// queued: a completion for a connection closed since is dropped.
type ioTarget struct {
	c    *cconn
	bc   *bconn
	gen  uint32 // c.gen when queued
	fd   int
	res  int32 // the send's result, once done
	done bool
}

// newRing sets up a loop's ring; tests replace it to see the fallback.
var newRing = uring.New

// ringMinBatch is the fewest reads or writes a round puts on the ring: a
// single one gains nothing from it (write(2) and read(2) are one system
// call as well, and cheaper ones) and goes the plain way. A loop reads it
// once, when made; tests lower it to 1 to send every write and read of
// the round through the ring.
var ringMinBatch = 2

// openRing sets up the loop's ring when Config.IOURing asks for one; where
// the kernel refuses, the loop writes with system calls as without the
// option, and the engine says so once.
func (l *evloop) openRing() {
	if !l.s.cfg.IOURing {
		return
	}
	r, err := newRing(ringEntries)
	if err != nil {
		if l.e.ringWarned.CompareAndSwap(false, true) {
			l.s.logger.Warn("http loop engine: -http-io-uring is on (its default) but io_uring cannot be set up here ("+ringRefusal(err)+"); serving without it, reading and writing with one system call each, as -http-io-uring=false (SLUICE_HTTP_IO_URING=false) does without this warning", "err", err)
		}
		return
	}
	l.ring = r
	l.e.ringLoops.Add(1)
	l.comps = make([]uring.Completion, ringEntries)
	l.minBatch = ringMinBatch
}

// ringRefusal names the likely cause of io_uring_setup's error, for the
// operator who reads the WARN.
func ringRefusal(err error) string {
	switch {
	case errors.Is(err, unix.EINVAL):
		return "likely a kernel before 5.18, which lacks IORING_SETUP_SUBMIT_ALL"
	case errors.Is(err, unix.ENOSYS):
		return "this kernel has no io_uring, or a seccomp profile hides it"
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return "sysctl kernel.io_uring_disabled (1: only members of kernel.io_uring_group), or a container's seccomp profile"
	case errors.Is(err, unix.ENOMEM):
		return "out of locked or kernel memory for the ring"
	}
	return "a container's seccomp profile, sysctl kernel.io_uring_disabled, or a kernel before 5.18"
}

// closeRing releases the ring, once the loop's connections are closed.
func (l *evloop) closeRing() {
	if l.ring != nil {
		l.ring.Close()
		l.ring = nil
		l.e.ringLoops.Add(-1)
	}
}

// deferWrite keeps p, an answer's bytes for a plain client with nothing
// pending, for the round's batch. It reports false when the client's
// bytes go the plain way.
func (l *evloop) deferWrite(c *cconn, p []byte) bool {
	if l.ring == nil || c.tls != nil || c.tun {
		return false
	}
	if c.out == nil && len(l.outBufs) > 0 {
		n := len(l.outBufs) - 1
		c.out = l.outBufs[n]
		l.outBufs[n] = nil
		l.outBufs = l.outBufs[:n]
	}
	c.out = append(c.out[:0], p...)
	c.o = 0
	// As for bytes a slow client left: this deadline holds only until
	// the round's end, where the answer's progress sets the next one.
	c.deadline = l.now + int64(l.s.cfg.ClientReadTimeout)
	l.toFlush = append(l.toFlush, c)
	return true
}

// maxPooledOuts bounds the answer buffers a loop keeps: a round sends
// at most ringEntries through the ring, so more would only be held (at
// most 16 MiB a loop, after a burst of large answers).
const maxPooledOuts = ringEntries

// outWritten lets go of a client's answer buffer once all of it is
// written: with the ring, a loop keeps such buffers for the next answer
// rather than each idle connection keeping its own.
func (l *evloop) outWritten(c *cconn) {
	if cap(c.out) == 0 {
		c.out, c.o = nil, 0
		return
	}
	if l.ring == nil || cap(c.out) > maxPooledOut || len(l.outBufs) >= maxPooledOuts {
		c.out, c.o = c.out[:0], 0
		return
	}
	l.outBufs = append(l.outBufs, c.out[:0])
	c.out, c.o = nil, 0
}

// flushRound writes what the round left to write: the backends' requests
// and, with the ring, the clients' answers, in batches until handling
// the completions queues nothing more.
func (l *evloop) flushRound() {
	if l.ring == nil {
		l.flushBackends()
		return
	}
	for len(l.toWrite) > 0 || len(l.toFlush) > 0 {
		if l.ring == nil { // given up (ringFailed): the plain path writes the rest
			cs := l.toFlush
			l.toFlush = nil
			for _, c := range cs {
				if c.fd >= 0 && c.o < len(c.out) {
					l.flushQueued(c)
				}
			}
			l.flushBackends()
			continue
		}
		l.submitWrites()
	}
}

// flushQueued writes a queued client's pending bytes the plain way: a
// tunnel's as a tunnel's (see submitWrites), others' as an answer's.
func (l *evloop) flushQueued(c *cconn) {
	if c.tun {
		l.tunFlushClient(c)
		return
	}
	l.flushClient(c)
}

// submitWrites queues the writes waiting in toWrite and toFlush as one
// batch, submits it, and handles each completion as write(2)'s result.
func (l *evloop) submitWrites() {
	bs, cs := l.toWrite, l.toFlush
	l.toWrite, l.toFlush = l.toBuf[:0], l.flushBuf[:0]
	tg := l.targets[:0]
	room := l.ring.Entries()
	for i, bc := range bs {
		bs[i] = nil
		if bc.fd < 0 || bc.c == nil || len(bc.pend) == 0 || bc.connecting || !bc.wready || bc.batched {
			continue // as flushBackends; or queued twice, and once in a batch is all
		}
		if len(bc.hdr) > 0 || len(tg) == room {
			// A PROXY header goes first, and a short write of it must
			// stop the request behind it: the plain path does that.
			l.writeBackend(bc)
			continue
		}
		bc.batched = true
		tg = append(tg, ioTarget{bc: bc, c: bc.c, fd: bc.fd})
	}
	l.toBuf = bs[:0]
	for i, c := range cs {
		cs[i] = nil
		if c.fd < 0 || c.o >= len(c.out) || c.batched {
			// Closed, or written by its own EPOLLOUT meanwhile, or queued
			// twice (written by its EPOLLOUT, then more of the answer).
			continue
		}
		if c.tun || len(tg) == room {
			// No room left in the batch; or queued for an answer's
			// bytes, then written by its own EPOLLOUT, whose resumed
			// relay switched it to a tunnel: the bytes now pending are
			// the tunnel's, left by a plain write. Either way the plain
			// path writes them, a tunnel's as a tunnel's.
			l.flushQueued(c)
			continue
		}
		c.batched = true
		tg = append(tg, ioTarget{c: c, gen: c.gen, fd: c.fd})
	}
	l.flushBuf = cs[:0]
	l.targets = tg
	if len(tg) < l.minBatch {
		for _, t := range tg {
			if t.bc != nil {
				t.bc.batched = false
			} else {
				t.c.batched = false
			}
			l.writeTarget(t)
		}
		clear(tg)
		return
	}
	// The ring takes them all (at most Entries, none in flight); were one
	// refused, so would be those after it, which Submit then does not
	// count as taken: they are written the plain way below.
	for i, t := range tg {
		if t.bc != nil {
			l.ring.Send(t.fd, t.bc.pend, uint64(i))
		} else {
			l.ring.Send(t.fd, t.c.out[t.c.o:], uint64(i))
		}
	}
	// Every completion is collected before any is handled: handling
	// one may reuse buffers (c.out) and descriptors, which must not
	// happen while the kernel may still use them.
	taken, err := l.ring.Submit(0)
	l.e.uringSends.Add(uint64(taken))
	for done := 0; done < taken && err == nil; {
		n := l.ring.Reap(l.comps)
		if n == 0 {
			err = l.ring.Wait(taken - done)
			continue
		}
		for _, cq := range l.comps[:n] {
			tg[cq.User].res, tg[cq.User].done = cq.Res, true
		}
		done += n
	}
	if err != nil {
		l.ringFailed(err) // closing the ring ends what it still held
	}
	for _, t := range tg {
		if t.bc != nil {
			t.bc.batched = false
		} else {
			t.c.batched = false
		}
	}
	for i, t := range tg {
		switch {
		case t.done:
			l.completed(t, t.res)
		case i >= taken:
			l.writeTarget(t) // never taken: written the plain way
		default:
			l.lost(t) // taken, its result unknown: the connection's state is too
		}
	}
	clear(tg)
}

// completed handles the result of one send as write(2)'s.
func (l *evloop) completed(t ioTarget, res int32) {
	if bc := t.bc; bc != nil {
		if bc.fd != t.fd || bc.c != t.c {
			return // closed or given to another request since it was queued
		}
		switch {
		case res >= 0:
			bc.pend = bc.pend[res:]
			if len(bc.pend) > 0 {
				l.writeBackend(bc) // a short write: the plain path writes on until EAGAIN
			}
		case res == -int32(unix.EAGAIN):
			bc.wready = false
		case res == -int32(unix.EINTR):
			l.writeBackend(bc)
		default:
			l.backendBroke(bc)
		}
		return
	}
	c := t.c
	if c.fd != t.fd || c.gen != t.gen {
		return
	}
	switch {
	case res >= 0:
		c.o += int(res)
		c.deadline = l.now + int64(l.s.cfg.ClientReadTimeout)
		l.flushClient(c) // writes any rest, then resumes the relay or the next request
	case res == -int32(unix.EAGAIN):
		// The next EPOLLOUT edge flushes, as for a slow client.
	case res == -int32(unix.EINTR):
		l.flushClient(c)
	default:
		l.closeClient(c)
	}
}

// writeTarget writes a queued target the plain way.
func (l *evloop) writeTarget(t ioTarget) {
	if bc := t.bc; bc != nil {
		if bc.fd == t.fd && bc.c == t.c {
			l.writeBackend(bc)
		}
		return
	}
	if c := t.c; c.fd == t.fd && c.gen == t.gen {
		l.flushClient(c)
	}
}

// lost closes the connection of a send whose result is unknown.
func (l *evloop) lost(t ioTarget) {
	if bc := t.bc; bc != nil {
		if bc.fd == t.fd && bc.c == t.c {
			l.backendBroke(bc)
		}
		return
	}
	if c := t.c; c.fd == t.fd && c.gen == t.gen {
		l.closeClient(c)
	}
}

// ringFailed gives up the ring after io_uring_enter failed: the loop
// writes with system calls from here on.
func (l *evloop) ringFailed(err error) {
	l.s.logger.Warn("http loop engine: io_uring_enter failed; this loop reads and writes with one system call each from now on (sluice_http_io_uring_loops counts the loops that still batch)", "err", err)
	l.closeRing()
}

// prefetchReads reads, with one io_uring_enter, what the round's first n
// events announce on plain client and backend connections whose handler
// would read first thing: an idle client (its next request) and a
// backend whose answer is being relayed. Each result is put where the
// handler's own read would have put it (the bytes at the end of the
// connection's buffer, rready as that read leaves it) and the connection
// marked fresh, so that its event does not mark it readable again; the
// handler then finds the bytes buffered and reads on only as it would
// have after that read. An end of stream is left for the handler's own
// read to find again (it stays), a backend's error is kept for its next
// read (preErr). Any other connection, and any event the ring has no
// room for, is read by its handler as without the ring.
func (l *evloop) prefetchReads(n int) {
	tg := l.targets[:0]
	room := l.ring.Entries()
	for i := 0; i < n && len(tg) < room; i++ {
		ev := l.events[i]
		fd := int(ev.Fd)
		if ev.Events&unix.EPOLLIN == 0 || ev.Events&evPeerShut != 0 || fd < 0 || fd >= len(l.fds) {
			continue
		}
		switch o := l.fds[fd]; {
		case o.c != nil:
			c := o.c
			if c.tun || c.tls != nil || c.pp != proxyDone || c.busy || c.closing || c.hup || c.o < len(c.out) || c.r != c.w {
				continue
			}
			c.r, c.w = 0, 0
			if c.in == nil {
				c.in = l.getBuf()
			}
			tg = append(tg, ioTarget{c: c, gen: c.gen, fd: fd})
		case o.b != nil:
			bc, c := o.b, o.b.c
			if bc.tun || bc.connecting || bc.hup || c == nil || c.x.bc != bc || c.fd < 0 || c.o < len(c.out) || bc.r != bc.w {
				continue
			}
			bc.r, bc.w = 0, 0
			tg = append(tg, ioTarget{bc: bc, c: c, fd: fd})
		}
	}
	l.targets = tg
	if len(tg) < l.minBatch || len(tg) == 0 {
		clear(tg) // their handlers read
		return
	}
	for i, t := range tg {
		if t.bc != nil {
			l.ring.Recv(t.fd, t.bc.in, uint64(i))
		} else {
			l.ring.Recv(t.fd, t.c.in, uint64(i))
		}
	}
	taken, err := l.ring.Submit(0)
	l.e.uringRecvs.Add(uint64(taken))
	for done := 0; done < taken && err == nil; {
		m := l.ring.Reap(l.comps)
		if m == 0 {
			err = l.ring.Wait(taken - done)
			continue
		}
		for _, cq := range l.comps[:m] {
			tg[cq.User].res, tg[cq.User].done = cq.Res, true
		}
		done += m
	}
	if err != nil {
		l.ringFailed(err)
	}
	for i, t := range tg {
		switch {
		case t.done:
			l.received(t)
		case i < taken:
			l.lost(t) // read, into the buffer, how much unknown: the connection cannot go on
		}
		// Not taken: the handler reads as without the ring.
	}
	clear(tg)
}

// received puts the result of one batched read where the connection's
// handler would have put it (clientIn, relay).
func (l *evloop) received(t ioTarget) {
	res := t.res
	if bc := t.bc; bc != nil {
		switch {
		case res > 0:
			bc.rready = int(res) == len(bc.in)-bc.w // a short read drained the socket
			bc.w += int(res)
			if bc.c.x.gotHead {
				bc.deadline = l.now + int64(l.s.cfg.BackendTimeout)
			}
			bc.fresh = true
		case res == -int32(unix.EAGAIN):
			bc.rready = false
			bc.fresh = true
		case res < 0 && res != -int32(unix.EINTR):
			bc.preErr = unix.Errno(-res)
		}
		return
	}
	c := t.c
	switch {
	case res > 0:
		c.headStart = l.now
		c.rready = int(res) == len(c.in)-c.w
		c.w += int(res)
		c.fresh = true
	case res == -int32(unix.EAGAIN):
		c.rready = false
		l.dropInBuf(c)
		c.fresh = true
	}
	// An end of stream or an error: the handler's read finds it again.
}
