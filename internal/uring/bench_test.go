//go:build linux

package uring

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"unsafe"

	"github.com/sluicelb/sluice/internal/benchcpu"
	"golang.org/x/sys/unix"
)

// The go/no-go measurement for batching a round's socket I/O: K loopback
// TCP connections; per round a 300-byte write to (or read from) each, as
// K write(2)/read(2) system calls (raw, as the HTTP loop engine makes
// them) or as K SEND/RECV operations in one io_uring_enter.
//
// Wall time is noisy on a shared machine, so each benchmark reports CPU
// time per socket operation two ways:
//
//   - thr-ns/sockop: the benchmark thread's CPU time (CLOCK_THREAD_CPUTIME_ID)
//     over the measured rounds only, in windows of benchWindow rounds; the
//     peer's side (draining what was written, or writing what is read) runs
//     between windows, outside them. This is the figure to compare.
//   - cpu-ns/sockop: the process's CPU time (getrusage) over the whole run,
//     the peer's side included (the same for both ways of doing the I/O).
//
// Run: go test -run - -bench . -benchmem -benchtime 200ms ./internal/uring/

const (
	benchMsg    = 300
	benchWindow = 16 // rounds per measured window: 16 x 300 bytes stay well within a loopback socket's buffers
)

var benchKs = []int{1, 8, 32, 128}

type benchConns struct {
	local, peer []int
}

func newBenchConns(b *testing.B, k int) benchConns {
	var c benchConns
	for range k {
		a, p := tcpPair(b)
		c.local = append(c.local, a)
		c.peer = append(c.peer, p)
	}
	return c
}

func threadCPU() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

// readFull reads exactly len(buf) bytes from non-blocking fd, spinning on
// EAGAIN (on loopback the bytes are already queued or about to be).
func readFull(b *testing.B, fd int, buf []byte) {
	for got := 0; got < len(buf); {
		n, err := unix.Read(fd, buf[got:])
		if errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil || n == 0 {
			b.Fatalf("peer read: %d, %v", n, err)
		}
		got += n
	}
}

func writeFull(b *testing.B, fd int, buf []byte) {
	for put := 0; put < len(buf); {
		n, err := unix.Write(fd, buf[put:])
		if errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			b.Fatalf("peer write: %d, %v", n, err)
		}
		put += n
	}
}

// runRounds runs b.N rounds in windows, calling round for each measured
// round and, around each window, the peer's side (not measured), and reports the
// per-socket-operation costs.
func runRounds(b *testing.B, k int, round func(), before, after func(rounds int)) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var thr int64
	b.ResetTimer()
	cpu0 := benchcpu.Now()
	for done := 0; done < b.N; {
		w := min(benchWindow, b.N-done)
		if before != nil {
			before(w)
		}
		t0 := threadCPU()
		for range w {
			round()
		}
		thr += threadCPU() - t0
		if after != nil {
			after(w)
		}
		done += w
	}
	ops := b.N * k
	b.ReportMetric(float64(benchcpu.Now()-cpu0)/float64(ops), "cpu-ns/sockop")
	b.ReportMetric(float64(thr)/float64(ops), "thr-ns/sockop")
}

func BenchmarkWrite(b *testing.B) {
	msg := make([]byte, benchMsg)
	for _, k := range benchKs {
		for _, way := range []string{"syscall", "uring"} {
			b.Run(fmt.Sprintf("K=%d/%s", k, way), func(b *testing.B) {
				c := newBenchConns(b, k)
				drain := make([]byte, benchMsg*benchWindow)
				after := func(w int) {
					for _, fd := range c.peer {
						readFull(b, fd, drain[:benchMsg*w])
					}
				}
				var round func()
				switch way {
				case "syscall":
					round = func() {
						for _, fd := range c.local {
							if n, e := rawWrite(fd, msg); e != 0 || n != benchMsg {
								b.Fatalf("write: %d, %v", n, e)
							}
						}
					}
				case "uring":
					r := newRing(b, uint32(k))
					cs := make([]Completion, k)
					round = func() {
						for i, fd := range c.local {
							r.Send(fd, msg, uint64(i))
						}
						if _, err := r.Submit(k); err != nil {
							b.Fatal(err)
						}
						if n := r.Reap(cs); n != k {
							b.Fatalf("reaped %d of %d", n, k)
						}
						for _, cq := range cs {
							if cq.Res != benchMsg {
								b.Fatalf("send: %d", cq.Res)
							}
						}
					}
				}
				runRounds(b, k, round, nil, after)
			})
		}
	}
}

func BenchmarkRead(b *testing.B) {
	msg := make([]byte, benchMsg*benchWindow)
	for _, k := range benchKs {
		for _, way := range []string{"syscall", "uring"} {
			b.Run(fmt.Sprintf("K=%d/%s", k, way), func(b *testing.B) {
				c := newBenchConns(b, k)
				bufs := make([][]byte, k)
				for i := range bufs {
					bufs[i] = make([]byte, benchMsg)
				}
				before := func(w int) {
					for _, fd := range c.peer {
						writeFull(b, fd, msg[:benchMsg*w])
					}
				}
				var round func()
				switch way {
				case "syscall":
					round = func() {
						for i, fd := range c.local {
							if n, e := rawRead(fd, bufs[i]); e != 0 || n != benchMsg {
								b.Fatalf("read: %d, %v", n, e)
							}
						}
					}
				case "uring":
					r := newRing(b, uint32(k))
					cs := make([]Completion, k)
					round = func() {
						for i, fd := range c.local {
							r.Recv(fd, bufs[i], uint64(i))
						}
						if _, err := r.Submit(k); err != nil {
							b.Fatal(err)
						}
						if n := r.Reap(cs); n != k {
							b.Fatalf("reaped %d of %d", n, k)
						}
						for _, cq := range cs {
							if cq.Res != benchMsg {
								b.Fatalf("recv: %d", cq.Res)
							}
						}
					}
				}
				runRounds(b, k, round, before, nil)
			})
		}
	}
}

// rawWrite and rawRead are the loop engine's own system calls (http/epoll_linux.go).
func rawWrite(fd int, p []byte) (int, unix.Errno) {
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(r), e
}

func rawRead(fd int, p []byte) (int, unix.Errno) {
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(r), e
}
