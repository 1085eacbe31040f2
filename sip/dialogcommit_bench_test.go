//go:build linux

package sip

import (
	"encoding/binary"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// seqpacketDialogs is a DialogCommitter that costs what the store's does
// (persist.Store.CommitDialogs): it encodes the records and sends them as
// one message on a SOCK_SEQPACKET socketpair with MSG_DONTWAIT; a
// goroutine reads the other end, as the store process does.
type seqpacketDialogs struct {
	fd  int
	msg []byte
}

func (d *seqpacketDialogs) WriteDialogs(put []StoredDialog, del []uint64) {}

func (d *seqpacketDialogs) CommitDialogs(put []StoredDialog) bool {
	d.msg = append(d.msg[:0], 1)
	for _, r := range put {
		d.msg = binary.BigEndian.AppendUint64(d.msg, r.Key)
		d.msg = binary.BigEndian.AppendUint64(d.msg, uint64(r.Expires.UnixNano()))
		d.msg = binary.BigEndian.AppendUint32(d.msg, r.ToTag)
		d.msg = binary.BigEndian.AppendUint16(d.msg, r.Src)
		d.msg = append(d.msg, 0, byte(len(r.Ref)))
		d.msg = append(d.msg, r.Ref...)
	}
	return syscall.Sendto(d.fd, d.msg, syscall.MSG_DONTWAIT|syscall.MSG_NOSIGNAL, nil) == nil
}

func newSeqpacketDialogs(b *testing.B) *seqpacketDialogs {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	_ = syscall.SetsockoptInt(fds[0], syscall.SOL_SOCKET, syscall.SO_SNDBUF, 1<<20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := syscall.Read(fds[1], buf)
			if n <= 0 && err != syscall.EINTR {
				return
			}
		}
	}()
	b.Cleanup(func() {
		syscall.Close(fds[0])
		<-done
		syscall.Close(fds[1])
	})
	return &seqpacketDialogs{fd: fds[0]}
}

// BenchmarkDialogCommit2xx is what holding the first 2xx until its
// dialog is committed costs per call, on a started server relaying a
// typical 200 over UDP to a client socket: the dialog's claim and
// confirm, then the relay, then the client's read of it. "direct" relays
// at once (the batched write-through only); "held" goes through
// relayConfirmed and a committer that sends the record as the store's
// does. burst=1 waits for each 200 before the next call (an idle
// balancer: the difference is the added 2xx latency, goroutine start and
// commit included); burst=32 holds 32 calls' 2xx before reading them (a
// busy one: group commits of several calls; the difference is the CPU a
// call costs).
func BenchmarkDialogCommit2xx(b *testing.B) {
	res200 := "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK776asdhds;received=127.0.0.1;rport=5060\r\n" +
		"From: <sip:alice@atlanta.example.com>;tag=1928301774\r\nTo: <sip:bob@biloxi.example.com>;tag=a6c85cf\r\n" +
		"Call-ID: a84b4c76e66710@pc33.atlanta.example.com\r\nCSeq: 314159 INVITE\r\nContact: <sip:bob@192.0.2.4>\r\n" +
		"Record-Route: <sip:127.0.0.1:5060;lr;sluice=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA>\r\nContent-Type: application/sdp\r\nContent-Length: 0\r\n\r\n"
	for _, burst := range []int{1, 32} {
		for _, held := range []bool{false, true} {
			name := fmt.Sprintf("burst=%d/direct", burst)
			if held {
				name = fmt.Sprintf("burst=%d/held", burst)
			}
			b.Run(name, func(b *testing.B) {
				b1 := newUAS(b, "b1")
				s := testServer(b, []*uas{b1}, nil, nil)
				if held {
					s.SetDialogStore(newSeqpacketDialogs(b))
				} else {
					s.SetDialogStore(&discardDialogs{})
				}
				c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				_ = c.SetReadBuffer(4 << 20)
				dst := target{addr: c.LocalAddr().(*net.UDPAddr).AddrPort()}
				m, err := gosip.ParseMessage([]byte(res200))
				if err != nil {
					b.Fatal(err)
				}
				res := m.(*gosip.Response)
				buf := make([]byte, 4096)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i += burst {
					n := min(burst, b.N-i)
					for j := range n {
						now := s.clock.Now()
						k := s.dialogs.key(fmt.Sprint(i+j), "1928301774")
						s.dialogs.remove(k)
						s.dialogs.claimIn(k, "", "b1", 7, now)
						first := s.dialogs.confirm(k, "a6c85cf")
						if !first || !s.relayConfirmed(k, res, dst, now) {
							s.relay(res, dst)
						}
					}
					for range n {
						if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				if held && s.metrics.DialogStoreUnsafe.Load() != 0 {
					b.Fatalf("%d commits failed", s.metrics.DialogStoreUnsafe.Load())
				}
			})
		}
	}
}

// BenchmarkDialogCommitSend is the part of BenchmarkDialogCommit2xx's
// "held" that "direct" does not do, alone: one call's record committed as
// the store's CommitDialogs does (encode, one non-blocking send on a
// SOCK_SEQPACKET socketpair whose other end a goroutine reads).
func BenchmarkDialogCommitSend(b *testing.B) {
	d := newSeqpacketDialogs(b)
	rec := []StoredDialog{{Key: 1, Ref: "default\x00b1", ToTag: 7, Src: 3}}
	b.ReportAllocs()
	full := 0
	for i := range b.N {
		rec[0].Key = uint64(i)
		for !d.CommitDialogs(rec) {
			// The reader is behind (it never is at call rates): let it
			// catch up, off the clock.
			full++
			b.StopTimer()
			time.Sleep(time.Millisecond)
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(full)/float64(b.N), "full/op")
}

// BenchmarkUDPSend2xx is the yardstick of BenchmarkDialogCommitSend on
// the same machine: relaying a 2xx's bytes (a 500-byte UDP datagram to a
// loopback socket a goroutine reads), which every call does anyway.
func BenchmarkUDPSend2xx(b *testing.B) {
	r, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	_ = r.SetReadBuffer(4 << 20)
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, _, err := r.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
		}
	}()
	defer r.Close()
	w, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	dst := r.LocalAddr().(*net.UDPAddr).AddrPort()
	msg := make([]byte, 500)
	b.ReportAllocs()
	for range b.N {
		if _, err := w.WriteToUDPAddrPort(msg, dst); err != nil {
			b.Fatal(err)
		}
	}
}
