package sip

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

// BenchmarkIdleConnMemory measures what an idle client connection costs
// the balancer on each stream transport: N connections (SLUICE_IDLE_CONNS,
// default 1,000) each send one OPTIONS the balancer answers itself, read
// the answer and then wait. The clients run in a child process, so the
// heap and goroutine stacks measured are the server's alone; the figure
// is (heap in use + stacks in use) after a collection with the
// connections open, minus the same before, per connection. ws-half is a
// plain WebSocket connection before its upgrade: half a request head
// sent, then nothing (what it holds until the handshake deadline). Run it
// alone:
//
//	go test -run '^$' -bench IdleConnMemory -benchtime 1x ./sip/
//
// SLUICE_IDLE_HEAPPROFILE=FILE writes the heap profile with the
// connections open to FILE.tcp, FILE.tls and so on (add -memprofilerate 1
// for every allocation; go tool pprof -inuse_space FILE.wss).
func BenchmarkIdleConnMemory(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("SLUICE_IDLE_CONNS")); err == nil && v > 0 {
		n = v
	}
	for _, tr := range []string{"tcp", "tls", "ws", "wss", "ws-half"} {
		b.Run(tr, func(b *testing.B) {
			for range b.N {
				measureIdle(b, tr, n)
			}
		})
	}
}

// writeHeapProfile writes the heap profile to path (the connections
// open), for go tool pprof -inuse_space.
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

func memInUse() (heap, stack int64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse), int64(ms.StackInuse)
}

func measureIdle(b *testing.B, tr string, n int) {
	b1 := newUAS(b, "b1")
	s, _ := edgeServer(b, []*uas{b1}, func(c *Config) {
		c.TCPMaxConns = n + 10
		c.TCPMaxConnsPerSource = n + 10
	})
	var addr net.Addr
	switch tr {
	case "tcp":
		addr = s.Addr()
	case "tls":
		addr = s.TLSAddr()
	case "ws", "ws-half":
		addr = s.WSAddr()
	case "wss":
		addr = s.WSSAddr()
	}
	heap0, stack0 := memInUse()
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleClients$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("SLUICE_IDLE_CLIENT=%s,%s,%d", tr, addr, n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	sc := bufio.NewScanner(out)
	ready := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ready") {
			ready = true
			break
		}
	}
	if !ready {
		b.Fatalf("clients did not connect")
	}
	if tr == "ws-half" {
		// Nothing answers half a head: give the readers the time to read
		// what was sent before measuring.
		eventually(b, "the half heads accepted", func() bool { return s.tcp.len() == n })
		time.Sleep(200 * time.Millisecond)
	}
	heap1, stack1 := memInUse()
	if f := os.Getenv("SLUICE_IDLE_HEAPPROFILE"); f != "" {
		writeHeapProfile(b, f+"."+tr)
	}
	conns := float64(s.tcp.len())
	heap, stack := float64(heap1-heap0)/conns, float64(stack1-stack0)/conns
	b.Logf("%s: %.0f idle connections, %.0f bytes each: %.0f of heap, %.0f of stacks", tr, conns, heap+stack, heap, stack)
	b.ReportMetric(heap+stack, "bytes/conn")
	b.ReportMetric(heap, "heap-bytes/conn")
}

// TestIdleClients is the client side of BenchmarkIdleConnMemory, run in
// a child process; it does nothing in a normal test run.
func TestIdleClients(t *testing.T) {
	spec := os.Getenv("SLUICE_IDLE_CLIENT")
	if spec == "" {
		t.Skip("the child process of BenchmarkIdleConnMemory")
	}
	f := strings.Split(spec, ",")
	tr, addr := f[0], f[1]
	n, _ := strconv.Atoi(f[2])
	insecure := &tls.Config{InsecureSkipVerify: true}
	conns := make([]net.Conn, 0, n)
	for i := range n {
		var c net.Conn
		var err error
		switch tr {
		case "tcp":
			c, err = net.Dial("tcp", addr)
		case "tls":
			c, err = tls.Dial("tcp", addr, insecure)
		case "ws", "wss":
			d := ws.Dialer{Protocols: []string{"sip"}, TLSConfig: insecure}
			c, _, _, err = d.Dial(context.Background(), tr+"://"+addr+"/")
		case "ws-half": // half an upgrade request head, then nothing
			if c, err = net.Dial("tcp", addr); err == nil {
				_, err = c.Write([]byte(wsUpgradeHead[:len(wsUpgradeHead)/2]))
			}
		}
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		if tr == "ws-half" {
			continue
		}
		msg := fmt.Sprintf("OPTIONS sip:%s SIP/2.0\r\nVia: SIP/2.0/%s %s;branch=z9hG4bK-idle-%d\r\nMax-Forwards: 0\r\nFrom: <sip:a@test>;tag=1\r\nTo: <sip:%s>\r\nCall-ID: idle-%d@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n",
			addr, strings.ToUpper(tr), c.LocalAddr(), i, addr, i)
		if strings.HasPrefix(tr, "ws") {
			err = ws.WriteFrame(c, ws.MaskFrame(ws.NewTextFrame([]byte(msg))))
		} else {
			_, err = c.Write([]byte(msg))
		}
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		if _, err := c.Read(make([]byte, 2048)); err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}

// BenchmarkEdgeRoundTrip: one client per transport sends a request the
// balancer answers itself and reads the answer, one at a time: the cost
// of each transport's read and write path per message.
func BenchmarkEdgeRoundTrip(b *testing.B) {
	b1 := newUAS(b, "b1")
	s, cli := edgeServer(b, []*uas{b1}, nil)
	for _, tr := range []string{"tcp", "tls", "ws", "wss"} {
		b.Run(tr, func(b *testing.B) {
			var c net.Conn
			var err error
			switch tr {
			case "tcp":
				c, err = net.Dial("tcp", s.Addr().String())
			case "tls":
				c, err = tls.Dial("tcp", s.TLSAddr().String(), cli)
			case "ws":
				c, _, _, err = ws.Dialer{Protocols: []string{"sip"}}.Dial(context.Background(), "ws://"+s.WSAddr().String()+"/")
			case "wss":
				c, _, _, err = ws.Dialer{Protocols: []string{"sip"}, TLSConfig: cli}.Dial(context.Background(), "wss://"+s.WSSAddr().String()+"/")
			}
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			req := []byte(strings.Replace(optionsTo(s, c.LocalAddr(), "rt-"+tr), "Max-Forwards: 70", "Max-Forwards: 0", 1))
			if strings.HasPrefix(tr, "ws") {
				var fb strings.Builder
				_ = ws.WriteFrame(&fb, ws.MaskFrame(ws.NewTextFrame(req)))
				req = []byte(fb.String())
			}
			buf := make([]byte, 4096)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				_ = c.SetReadDeadline(time.Now().Add(wait))
				// The answer is small: one read takes it whole.
				if _, err := c.Read(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
