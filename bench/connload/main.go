// Command connload is an HTTP load client that opens a new connection for
// every request, at a fixed rate, optionally starting each with a PROXY
// protocol header: what bench/proxy-cost.sh drives sluice with to measure
// the header's cost per connection.
//
//	connload -addr 127.0.0.1:18301 -proxy v2 -rate 1500 -duration 10s
//
// Every 1/-rate seconds a request is due; -conns workers take them, each
// dialling, writing the header (v1 or v2 naming the worker's own
// addresses, or none) and `GET -path HTTP/1.1` with Connection: close in
// one write, reading the answer to its end and closing. A request
// succeeds on a 2xx status line; any other, an error or silence past
// -timeout fails it. Requests due while every worker is busy are not sent
// (counted as late: the offered rate was not held). A fixed rate, not a
// closed loop, so two configurations measured one after the other serve
// the same load. It prints one line, `requests=N ok=N failed=N late=N
// secs=S`, and exits 1 when a request failed.
//
// It refuses any address that is not loopback.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/proxyproto"
)

type config struct {
	addr     netip.AddrPort
	proxy    uint8 // 0: no header; 1, 2: its version
	rate     int
	conns    int
	duration time.Duration
	timeout  time.Duration
	path     string
}

func parseArgs(args []string) (config, error) {
	fs := flag.NewFlagSet("connload", flag.ContinueOnError)
	addr := fs.String("addr", "", "HOST:PORT to load (loopback only)")
	proxy := fs.String("proxy", "none", "PROXY protocol header to start each connection with: none, v1 or v2")
	rate := fs.Int("rate", 1000, "new connections (one request each) per second, 1..100000")
	conns := fs.Int("conns", 64, "workers: connections open at most at once, 1..10000")
	duration := fs.Duration("duration", 10*time.Second, "how long to load, 100ms..10m")
	timeout := fs.Duration("timeout", 5*time.Second, "a request not answered this long after its dial fails, 10ms..1m")
	path := fs.String("path", "/", "request path, starting with /")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	var c config
	ap, err := netip.ParseAddrPort(*addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return c, fmt.Errorf("-addr %q: want a loopback HOST:PORT such as 127.0.0.1:18301", *addr)
	}
	c.addr = ap
	switch *proxy {
	case "none":
	case "v1":
		c.proxy = 1
	case "v2":
		c.proxy = 2
	default:
		return c, fmt.Errorf("-proxy %q: want none, v1 or v2", *proxy)
	}
	switch {
	case *rate < 1 || *rate > 100000:
		return c, fmt.Errorf("-rate %d: want 1..100000 connections a second", *rate)
	case *conns < 1 || *conns > 10000:
		return c, fmt.Errorf("-conns %d: want 1..10000", *conns)
	case *duration < 100*time.Millisecond || *duration > 10*time.Minute:
		return c, fmt.Errorf("-duration %s: want 100ms..10m", *duration)
	case *timeout < 10*time.Millisecond || *timeout > time.Minute:
		return c, fmt.Errorf("-timeout %s: want 10ms..1m", *timeout)
	case len(*path) == 0 || (*path)[0] != '/' || bytes.ContainsAny([]byte(*path), " \r\n"):
		return c, fmt.Errorf("-path %q: want a path starting with / without spaces", *path)
	}
	c.rate, c.conns, c.duration, c.timeout, c.path = *rate, *conns, *duration, *timeout, *path
	return c, nil
}

// result counts the requests of a run.
type result struct {
	ok, failed, late atomic.Int64
	firstErr         atomic.Value
}

// one makes one request on a new connection; nil when answered 2xx.
func one(c config, req []byte) error {
	conn, err := net.DialTimeout("tcp", c.addr.String(), c.timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(c.timeout))
	msg := req
	if c.proxy != 0 {
		src := conn.LocalAddr().(*net.TCPAddr).AddrPort()
		dst := conn.RemoteAddr().(*net.TCPAddr).AddrPort()
		msg = append(proxyproto.Append(make([]byte, 0, proxyproto.MaxLen+len(req)), c.proxy, src, dst), req...)
	}
	if _, err := conn.Write(msg); err != nil {
		return err
	}
	br := bufio.NewReaderSize(conn, 512)
	line, err := br.ReadSlice('\n')
	if err != nil {
		return fmt.Errorf("no status line: %w", err)
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[9] != '2' {
		return fmt.Errorf("answer %q", bytes.TrimSpace(line))
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	return nil
}

func run(c config) *result {
	req := []byte("GET " + c.path + " HTTP/1.1\r\nHost: " + c.addr.String() + "\r\nConnection: close\r\n\r\n")
	var r result
	due := make(chan struct{}, c.conns)
	var wg sync.WaitGroup
	for range c.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range due {
				if err := one(c, req); err != nil {
					r.failed.Add(1)
					r.firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				r.ok.Add(1)
			}
		}()
	}
	start := time.Now()
	interval := time.Second / time.Duration(c.rate)
	for sent := 0; ; sent++ {
		next := start.Add(time.Duration(sent) * interval)
		if next.Sub(start) >= c.duration {
			break
		}
		time.Sleep(time.Until(next))
		select {
		case due <- struct{}{}:
		default:
			r.late.Add(1)
		}
	}
	close(due)
	wg.Wait()
	return &r
}

func main() {
	c, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "connload:", err)
		os.Exit(2)
	}
	start := time.Now()
	r := run(c)
	ok, failed, late := r.ok.Load(), r.failed.Load(), r.late.Load()
	fmt.Printf("requests=%d ok=%d failed=%d late=%d secs=%.2f\n", ok+failed, ok, failed, late, time.Since(start).Seconds())
	if failed > 0 {
		fmt.Fprintln(os.Stderr, "connload: first failure:", r.firstErr.Load())
		os.Exit(1)
	}
}
