// Package uring is a minimal io_uring for sockets: one ring of fixed size,
// on which a caller queues sends and receives of byte slices on
// descriptors it owns, submits them all with one io_uring_enter (waiting
// for as many completions as it asks), and reaps the completions. It is
// raw io_uring over golang.org/x/sys/unix, without cgo or a library.
//
// Why: on a machine where every system call's entry and exit is dear (a
// paravirtualised guest), a round of K writes costs K system calls through
// write(2) but one through a ring. What the ring cannot save is the work
// each send does in the kernel (TCP, and on loopback the receiver's side
// too); the package's benchmark measures which of the two dominates.
//
// Sends and receives are queued with MSG_DONTWAIT: a socket that is not
// ready completes at once with -EAGAIN instead of being polled by the
// kernel, and a send completes with the count the socket took, so a
// caller sees exactly what write(2) and read(2) on a non-blocking socket
// would have told it. The ring is not safe for concurrent use: one
// goroutine owns it, as one event loop owns its connections.
package uring

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kernel ABI (include/uapi/linux/io_uring.h).
const (
	opSend = 26 // IORING_OP_SEND
	opRecv = 27 // IORING_OP_RECV

	setupSubmitAll = 1 << 7 // IORING_SETUP_SUBMIT_ALL: one failed SQE does not stop the batch

	enterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS

	featSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP: SQ and CQ rings share one mapping

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	sqeSize = 64
	cqeSize = 16

	// MaxEntries bounds a ring's size: the kernel's own bound on SQ entries.
	MaxEntries = 32768
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// sqe is one submission queue entry, 64 bytes.
type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32 // msg_flags for SEND/RECV
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFDIn  int32
	addr3       uint64
	pad         uint64
}

// cqe is one completion queue entry, 16 bytes.
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// Completion is the result of one queued operation.
type Completion struct {
	// User is the value given when the operation was queued.
	User uint64
	// Res is what the system call would have returned: the byte count
	// (0 at end of stream for a receive), or a negated errno such as
	// -EAGAIN; see Err.
	Res int32
}

// Err returns the completion's error: nil for a byte count, else the
// errno (unix.EAGAIN when the socket was not ready).
func (c Completion) Err() error {
	if c.Res >= 0 {
		return nil
	}
	return unix.Errno(-c.Res)
}

// Ring is one io_uring instance with its shared rings mapped.
type Ring struct {
	fd int

	sqMem, cqMem, sqeMem []byte

	sqHead, sqTail, sqMask, sqArray *uint32
	sqes                            []sqe
	cqHead, cqTail                  *uint32
	cqMask                          uint32
	cqes                            []cqe
	sqEntries                       uint32

	tail     uint32 // our copy of the SQ tail: entries up to it are filled, not yet published
	queued   uint32 // filled since the last Submit
	inflight int    // submitted and not yet reaped
	// pins holds the buffers of operations not yet reaped, so that the
	// collector keeps them while the kernel may still use their memory.
	pins [][]byte
}

// ErrFull is returned by Send and Recv when the ring holds as many
// unsubmitted entries as it has room for: Submit first.
var ErrFull = errors.New("uring: submission queue full")

// New sets up a ring with room for entries operations per Submit (rounded
// up to a power of two by the kernel). It fails where io_uring is
// unavailable: an old kernel, a seccomp filter, or
// /proc/sys/kernel/io_uring_disabled set; callers fall back to plain
// system calls then.
func New(entries uint32) (*Ring, error) {
	if entries == 0 || entries > MaxEntries {
		return nil, fmt.Errorf("uring: %d entries: want 1 to %d", entries, MaxEntries)
	}
	var p params
	p.flags = setupSubmitAll
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil, fmt.Errorf("uring: io_uring_setup: %w", e)
	}
	r := &Ring{fd: int(fd), sqEntries: p.sqEntries}
	if err := r.mmap(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Ring) mmap(p *params) error {
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*cqeSize)
	single := p.features&featSingleMmap != 0
	if single && cqSize > sqSize {
		sqSize = cqSize
	}
	var err error
	r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap SQ ring: %w", err)
	}
	if single {
		r.cqMem = r.sqMem
	} else {
		r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("uring: mmap CQ ring: %w", err)
		}
	}
	r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap SQEs: %w", err)
	}
	sq := unsafe.Pointer(&r.sqMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.sqOff.tail))
	r.sqMask = (*uint32)(unsafe.Add(sq, p.sqOff.ringMask))
	r.sqArray = (*uint32)(unsafe.Add(sq, p.sqOff.array))
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	cq := unsafe.Pointer(&r.cqMem[0])
	r.cqHead = (*uint32)(unsafe.Add(cq, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.cqOff.ringMask))
	r.cqes = unsafe.Slice((*cqe)(unsafe.Add(cq, p.cqOff.cqes)), p.cqEntries)
	// Slot i of the SQ array always names SQE i: entries are used in order.
	arr := unsafe.Slice(r.sqArray, p.sqEntries)
	for i := range arr {
		arr[i] = uint32(i)
	}
	r.tail = atomic.LoadUint32(r.sqTail)
	return nil
}

// Close unmaps the rings and closes the ring's descriptor; operations
// queued and not submitted are never performed. Callers reap what they
// submitted first: the ring stops keeping its buffers.
func (r *Ring) Close() error {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
	}
	if r.cqMem != nil && unsafe.SliceData(r.cqMem) != unsafe.SliceData(r.sqMem) {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	r.sqMem, r.cqMem, r.sqeMem, r.sqes, r.cqes, r.pins = nil, nil, nil, nil, nil, nil
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// Entries is the number of operations the ring takes per Submit.
func (r *Ring) Entries() int { return int(r.sqEntries) }

// Queued is the number of operations queued since the last Submit.
func (r *Ring) Queued() int { return int(r.queued) }

// InFlight is the number of operations submitted and not yet reaped.
func (r *Ring) InFlight() int { return r.inflight }

// Send queues a send of p on socket fd (MSG_DONTWAIT; MSG_NOSIGNAL, so a
// reset peer is -EPIPE rather than a signal). p must not change until
// the completion that carries user is reaped.
func (r *Ring) Send(fd int, p []byte, user uint64) error {
	return r.queue(opSend, fd, p, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, user)
}

// Recv queues a receive into p from socket fd (MSG_DONTWAIT). p must not
// be read or reused until the completion that carries user is reaped.
func (r *Ring) Recv(fd int, p []byte, user uint64) error {
	return r.queue(opRecv, fd, p, unix.MSG_DONTWAIT, user)
}

func (r *Ring) queue(op uint8, fd int, p []byte, msgFlags uint32, user uint64) error {
	if r.queued+uint32(r.inflight) >= r.sqEntries {
		// Every queued or unreaped operation may need a CQE; the CQ ring
		// has room for twice the SQ entries, so this also keeps
		// completions from overflowing.
		return ErrFull
	}
	if uint64(len(p)) > math.MaxUint32 {
		return fmt.Errorf("uring: a buffer of %d bytes: an operation takes at most %d", len(p), uint32(math.MaxUint32))
	}
	e := &r.sqes[r.tail&*r.sqMask]
	*e = sqe{opcode: op, fd: int32(fd), len: uint32(len(p)), opFlags: msgFlags, userData: user}
	if len(p) > 0 {
		e.addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p))))
	}
	r.pins = append(r.pins, p)
	r.tail++
	r.queued++
	return nil
}

// Submit hands the queued operations to the kernel and waits until at
// least wait completions are ready (0: do not wait). It returns how many
// operations the kernel took: all that were queued, or on an error the
// first ones (possibly none), which complete as taken; the others are
// never performed (the caller does them another way and closes the
// ring, which discards them).
//
// Sends and receives on sockets complete within the io_uring_enter that
// takes them (they do not wait for readiness), so after Submit(0) their
// completions are ready to Reap; Submit(n) with n the queued count takes
// and reaps in one system call. The calls are raw: they do not block, so
// they need not tell the scheduler. Asking to wait for more completions
// than the queued and unreaped operations can give would block the
// thread: callers wait for at most what they queued.
func (r *Ring) Submit(wait int) (int, error) {
	atomic.StoreUint32(r.sqTail, r.tail)
	var flags uintptr
	if wait > 0 {
		flags = enterGetEvents
	}
	taken := 0
	for r.queued > 0 {
		got, _, e := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.queued), uintptr(wait), flags, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			runtime.KeepAlive(r.pins)
			return taken, fmt.Errorf("uring: io_uring_enter: %w", e)
		}
		if got == 0 {
			// The kernel found no entry past its head: the ring's
			// count and the kernel's disagree. Asking again would get
			// the same answer forever (a loop spinning on a core), so
			// the caller is told and gives the ring up.
			runtime.KeepAlive(r.pins)
			return taken, fmt.Errorf("uring: io_uring_enter took none of %d queued operations", r.queued)
		}
		r.queued -= uint32(got)
		r.inflight += int(got)
		taken += int(got)
		flags, wait = 0, 0 // the waiting is done with the submission
	}
	if wait > 0 { // nothing was queued: wait for what is in flight
		return 0, r.Wait(wait)
	}
	runtime.KeepAlive(r.pins)
	return taken, nil
}

// Wait waits until at least n completions are ready; n must not exceed
// InFlight.
func (r *Ring) Wait(n int) error {
	if n > r.inflight {
		return fmt.Errorf("uring: wait for %d completions with %d in flight", n, r.inflight)
	}
	for {
		_, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, uintptr(n), enterGetEvents, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return fmt.Errorf("uring: io_uring_enter: %w", e)
		}
		return nil
	}
}

// Reap copies the ready completions into dst, as many as fit, and returns
// how many it copied. When none is left in flight the ring lets go of the
// buffers it was keeping.
func (r *Ring) Reap(dst []Completion) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for head != tail && n < len(dst) {
		c := &r.cqes[head&r.cqMask]
		dst[n] = Completion{User: c.userData, Res: c.res}
		head++
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	r.inflight -= n
	if r.inflight == 0 && r.queued == 0 {
		clear(r.pins)
		r.pins = r.pins[:0]
	}
	return n
}
