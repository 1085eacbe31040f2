//go:build linux

package sip

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// BenchmarkUDPSend sends the datagrams one read batch makes (8 of a SIP
// message's size to one loopback peer, which a goroutine drains) one
// sendto each (each) or queued and sent with one sendmmsg (batch). Besides
// ns/op it reports the process's CPU time per datagram (cpu-ns/dgram:
// both ends, as on a machine where the peers share the core), which on a
// shared machine says more than the wall time.
func BenchmarkUDPSend(b *testing.B) {
	const perBatch = 8
	msg := make([]byte, 600)
	for _, mode := range []string{"each", "batch", "rawbatch"} {
		b.Run(mode, func(b *testing.B) {
			var cs [2]*net.UDPConn
			for i := range cs {
				c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
				if err != nil {
					b.Fatal(err)
				}
				_ = c.SetReadBuffer(4 << 20)
				defer c.Close()
				cs[i] = c
			}
			ln, peer := cs[0], cs[1]
			dst := peer.LocalAddr().(*net.UDPAddr).AddrPort()
			go func() {
				buf := make([]byte, 65536)
				for {
					if _, _, err := peer.ReadFromUDPAddrPort(buf); err != nil {
						return
					}
				}
			}()
			s := &Server{udp: ln}
			o := newUDPOut(ln, nil)
			if mode == "rawbatch" {
				o = newUDPOut(ln, newUDPRaw(ln))
			}
			cpu0 := cpuTime()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if mode != "each" {
					o.begin()
					for range perBatch {
						o.queue(s, msg, dst, nil, nil)
					}
					o.end(s)
					continue
				}
				for range perBatch {
					if _, err := ln.WriteToUDPAddrPort(msg, dst); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N*perBatch), "cpu-ns/dgram")
		})
	}
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
