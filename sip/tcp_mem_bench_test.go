package sip

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rssBytes is the process's resident set from /proc (0 where there is none).
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func heapInuse() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// BenchmarkTCPPartialMemory measures what slow partial messages cost: N
// connections (SLUICE_PARTIAL_CONNS, default 5,000) each send the head and
// all but the last 200 bytes of a 65,000-byte body and then wait. It
// reports the process's RSS and heap in use (both ends live in this
// process; the client side holds no buffer of its own) before, while the
// connections are open, and after they closed. Run it alone:
//
//	go test -run '^$' -bench TCPPartialMemory -benchtime 1x ./sip/
func BenchmarkTCPPartialMemory(b *testing.B) {
	n := 5000
	if v, err := strconv.Atoi(os.Getenv("SLUICE_PARTIAL_CONNS")); err == nil && v > 0 {
		n = v
	}
	// one-source: every connection from 127.0.0.1, the per-source cap
	// applies. budget-only: the cap raised, so the partial-message budget
	// alone bounds the memory (as with as many sources as connections).
	for _, perSource := range []int{0, n} {
		name := "one-source"
		if perSource > 0 {
			name = "budget-only"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				measurePartial(b, n, perSource)
			}
		})
	}
}

func measurePartial(b *testing.B, n, perSource int) {
	b1 := newUAS(b, "b1")
	s := testServer(b, []*uas{b1}, nil, func(c *Config) {
		c.TCPMaxConns = n + 10
		c.TCPMaxConnsPerSource = perSource
		c.TCPMessageTimeout = time.Minute
		c.TCPFirstMessageTimeout = time.Minute
	})
	runtime.GC()
	rss0, heap0 := rssBytes(), heapInuse()
	const body = 65000
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	pad := strings.Repeat("x", body-200)
	for i := range n {
		c, err := net.Dial("tcp", s.udpAddr().String())
		if err != nil {
			b.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		head := fmt.Sprintf("MESSAGE sip:%s SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-p%d\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=1\r\nTo: <sip:x@test>\r\nCall-ID: p%d@test\r\nCSeq: 1 MESSAGE\r\nContent-Length: %d\r\n\r\n", s.udpAddr(), c.LocalAddr(), i, i, body)
		_ = c.SetWriteDeadline(time.Now().Add(wait))
		if _, err := c.Write([]byte(head + pad)); err != nil {
			break // closed by the server: that is what a budget does
		}
	}
	// Let the readers take what was sent: until the heap stops growing.
	last, stable := heapInuse(), 0
	for deadline := time.Now().Add(30 * time.Second); stable < 5 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		h := heapInuse()
		if h-last < 1<<20 && last-h < 1<<20 {
			stable++
		} else {
			stable = 0
		}
		last = h
	}
	rss1, heap1 := rssBytes(), heapInuse()
	runtime.GC()
	live1 := heapInuse()
	open := s.tcp.len()
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	deadline := time.Now().Add(30 * time.Second)
	for s.tcp.len() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	runtime.GC()
	runtime.GC()
	time.Sleep(2 * time.Second) // the scavenger's pace, not an assertion
	rss2, heap2 := rssBytes(), heapInuse()
	debug.FreeOSMemory()
	rss3 := rssBytes()
	const mb = 1 << 20
	b.Logf("%d connections x %d-byte partial message: %d still open at the peak, %d bytes reserved at most, %d shed, %d refused by the per-source cap",
		n, body, open, s.tcp.budget.peak.Load(), s.metrics.TCPPartialShed.Load(), s.metrics.TCPRefusedSource.Load())
	b.Logf("RSS MB: start %d, open %d, 2 s after close %d, after FreeOSMemory %d", rss0/mb, rss1/mb, rss2/mb, rss3/mb)
	b.Logf("heap in use MB: start %d, open %d (%d after a collection), after close %d", heap0/mb, heap1/mb, live1/mb, heap2/mb)
	b.ReportMetric(float64(rss1)/mb, "rss-open-MB")
	b.ReportMetric(float64(heap1)/mb, "heap-open-MB")
	b.ReportMetric(float64(rss2)/mb, "rss-closed-MB")
	b.ReportMetric(float64(heap2)/mb, "heap-closed-MB")
}

// BenchmarkTCPRoundTrip: one TCP client sends a request the balancer
// answers itself and reads the answer, one at a time: the cost of the TCP
// read path per message (the connection waits between messages).
func BenchmarkTCPRoundTrip(b *testing.B) {
	b1 := newUAS(b, "b1")
	s := testServer(b, []*uas{b1}, nil, nil)
	c, err := net.Dial("tcp", s.udpAddr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	req := []byte(strings.Replace(optionsTo(s, c.LocalAddr(), "rt"), "Max-Forwards: 70", "Max-Forwards: 0", 1))
	buf := make([]byte, 4096)
	var pending []byte
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		for {
			if size, ok, _ := frame(pending, 1<<16); ok {
				pending = pending[size:]
				break
			}
			_ = c.SetReadDeadline(time.Now().Add(wait))
			n, err := c.Read(buf)
			if err != nil {
				b.Fatal(err)
			}
			pending = append(pending, buf[:n]...)
		}
	}
}
