// Command idleconn opens many keep-alive client connections to a server on
// loopback, makes one complete exchange on each, and then holds them idle,
// so that what the server keeps per idle connection can be measured from
// outside (bench/idle-mem.sh reads its memory before and after).
//
//	idleconn -addr 127.0.0.1:18601 -proto http -conns 100000 -sources 127.0.0.2-127.0.0.9
//
// Each connection is dialled from one of -sources in turn (bound before
// connect, with IP_BIND_ADDRESS_NO_PORT so the port is chosen per
// destination: one source address gives about 28,000 connections to one
// server address, the ephemeral port range), then carries one exchange:
//
//   - http: `GET -path HTTP/1.1` (keep-alive), its answer read to the end
//     of its Content-Length body; a 2xx status is wanted;
//   - https: the same over TLS (certificate not verified: loopback only);
//   - sip: one OPTIONS with Max-Forwards 0, which an edge answers itself
//     (sluice 200, Kamailio 483), so the connection has carried a SIP
//     message and is past the server's wait for a first one; any final
//     answer will do;
//   - sips: the same over TLS.
//
// At most -parallel connections are being opened at once. When every one
// has been tried it prints `ready open=N failed=N secs=S` and holds the
// open ones, without a goroutine or a buffer per connection, until -hold
// passes or it gets SIGTERM or SIGINT; it then peeks at each socket
// without blocking and prints `done open=N closed_by_peer=N spoke=N`
// (spoke: the server sent bytes nobody asked for, such as a timeout
// answer) and exits. It exits 1 when a connection failed to open.
//
// It refuses any address, server or source, that is not loopback.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxConns bounds -conns: a million descriptors is what one process may
// hold under the usual fs.nr_open.
const maxConns = 1_000_000

type config struct {
	addr     netip.AddrPort
	proto    string
	conns    int
	sources  []netip.Addr
	parallel int
	timeout  time.Duration
	hold     time.Duration
	path     string
	host     string
}

// parseSources reads "A-B" (a range of IPv4 addresses, last octet only
// varying) or "A,B,C"; every address must be loopback.
func parseSources(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	if lo, hi, ok := strings.Cut(s, "-"); ok {
		a, err1 := netip.ParseAddr(lo)
		b, err2 := netip.ParseAddr(hi)
		if err1 != nil || err2 != nil || !a.Is4() || !b.Is4() || b.Less(a) {
			return nil, fmt.Errorf("-sources %q: want FIRST-LAST IPv4 loopback addresses, such as 127.0.0.2-127.0.0.9", s)
		}
		if a4, b4 := a.As4(), b.As4(); [3]byte(a4[:3]) != [3]byte(b4[:3]) || !a.IsLoopback() {
			return nil, fmt.Errorf("-sources %q: want a loopback range varying in the last octet only", s)
		}
		for x := a; ; x = x.Next() {
			out = append(out, x)
			if x == b {
				break
			}
		}
		return out, nil
	}
	for _, f := range strings.Split(s, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(f))
		if err != nil || !a.IsLoopback() {
			return nil, fmt.Errorf("-sources %q: %q is not a loopback address", s, f)
		}
		out = append(out, a)
	}
	return out, nil
}

func parseArgs(args []string) (config, error) {
	fs := flag.NewFlagSet("idleconn", flag.ContinueOnError)
	addr := fs.String("addr", "", "HOST:PORT of the server (loopback only)")
	proto := fs.String("proto", "http", "exchange made on each connection before it goes idle: http, https, sip or sips (SIP over TLS)")
	conns := fs.Int("conns", 1000, "connections to open and hold, 1..1000000")
	sources := fs.String("sources", "127.0.0.1", "loopback source addresses, used in turn: FIRST-LAST or A,B,...")
	parallel := fs.Int("parallel", 64, "connections being opened at once at most, 1..4096")
	timeout := fs.Duration("timeout", 10*time.Second, "a connection whose dial and exchange take longer fails, 10ms..5m")
	hold := fs.Duration("hold", 30*time.Minute, "how long to hold the connections at most, 1s..24h")
	path := fs.String("path", "/", "HTTP request path, starting with /")
	host := fs.String("host", "localhost", "HTTP Host and TLS server name")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	var c config
	ap, err := netip.ParseAddrPort(*addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return c, fmt.Errorf("-addr %q: want a loopback HOST:PORT such as 127.0.0.1:18601", *addr)
	}
	c.addr = ap
	switch *proto {
	case "http", "https", "sip", "sips":
	default:
		return c, fmt.Errorf("-proto %q: want http, https, sip or sips", *proto)
	}
	srcs, err := parseSources(*sources)
	if err != nil {
		return c, err
	}
	for _, s := range srcs {
		if s.Is4() != ap.Addr().Is4() {
			return c, fmt.Errorf("-sources %q: %s is not of -addr's family", *sources, s)
		}
	}
	switch {
	case *conns < 1 || *conns > maxConns:
		return c, fmt.Errorf("-conns %d: want 1..%d", *conns, maxConns)
	case *parallel < 1 || *parallel > 4096:
		return c, fmt.Errorf("-parallel %d: want 1..4096", *parallel)
	case *timeout < 10*time.Millisecond || *timeout > 5*time.Minute:
		return c, fmt.Errorf("-timeout %s: want 10ms..5m", *timeout)
	case *hold < time.Second || *hold > 24*time.Hour:
		return c, fmt.Errorf("-hold %s: want 1s..24h", *hold)
	case len(*path) == 0 || (*path)[0] != '/' || strings.ContainsAny(*path, " \r\n"):
		return c, fmt.Errorf("-path %q: want a path starting with / without spaces", *path)
	case *host == "" || strings.ContainsAny(*host, " \r\n"):
		return c, fmt.Errorf("-host %q: want a host name without spaces", *host)
	}
	c.proto, c.conns, c.sources, c.parallel = *proto, *conns, srcs, *parallel
	c.timeout, c.hold, c.path, c.host = *timeout, *hold, *path, *host
	return c, nil
}

// held is one open connection: the socket to peek at, and the connection
// to close (the TLS one over it for https).
type held struct {
	tcp  *net.TCPConn
	conn net.Conn
}

// sip says whether the exchange is SIP's.
func (c config) sip() bool { return c.proto == "sip" || c.proto == "sips" }

// tls says whether the connection is over TLS.
func (c config) tls() bool { return c.proto == "https" || c.proto == "sips" }

// request is what connection i sends.
func request(c config, i int) []byte {
	if c.sip() {
		transport := "TCP"
		if c.proto == "sips" {
			transport = "TLS"
		}
		return fmt.Appendf(nil, "OPTIONS sip:edge.invalid SIP/2.0\r\nVia: SIP/2.0/%s i%d.invalid;branch=z9hG4bKidle%d\r\nMax-Forwards: 0\r\nFrom: <sip:idleconn@edge.test>;tag=i%d\r\nTo: <sip:edge.invalid>\r\nCall-ID: idle-%d@idleconn\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n", transport, i, i, i, i)
	}
	return fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: idleconn\r\n\r\n", c.path, c.host)
}

// maxHead bounds an answer's head and maxBody its body: what the client
// reads is bounded whatever the server sends.
const (
	maxHead = 16 << 10
	maxBody = 1 << 20
)

// readAnswer reads one answer (head, then a Content-Length body) and
// checks its status: 2xx for HTTP, any final (>= 200) for SIP, whose
// provisional answers are skipped. It fails when bytes follow the answer
// in what was read: the connection must be idle after it.
func readAnswer(br *bufio.Reader, sip bool) error {
	for {
		var head []byte
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return fmt.Errorf("reading the answer's head: %w", err)
			}
			head = append(head, line...)
			if len(head) > maxHead {
				return errors.New("answer head over 16 KiB")
			}
			if len(bytes.TrimRight(line, "\r\n")) == 0 {
				if len(head) == len(line) { // a keep-alive CRLF before the answer
					head = head[:0]
					continue
				}
				break
			}
		}
		lines := strings.Split(strings.TrimRight(string(head), "\r\n"), "\n")
		status := strings.TrimSpace(lines[0])
		proto, rest, _ := strings.Cut(status, " ")
		code, err := strconv.Atoi(strings.SplitN(rest, " ", 2)[0])
		switch {
		case err != nil:
			return fmt.Errorf("answer %q: no status code", status)
		case sip && proto != "SIP/2.0", !sip && !strings.HasPrefix(proto, "HTTP/1."):
			return fmt.Errorf("answer %q: not the protocol asked", status)
		}
		length := 0
		for _, l := range lines[1:] {
			k, v, _ := strings.Cut(l, ":")
			k = strings.ToLower(strings.TrimSpace(k))
			v = strings.TrimSpace(v)
			switch {
			case k == "content-length" || (sip && k == "l"):
				if length, err = strconv.Atoi(v); err != nil || length < 0 || length > maxBody {
					return fmt.Errorf("answer %q: Content-Length %q", status, v)
				}
			case k == "transfer-encoding" && !strings.EqualFold(v, "identity"):
				return fmt.Errorf("answer %q: Transfer-Encoding %q not read by this client", status, v)
			}
		}
		if _, err := io.CopyN(io.Discard, br, int64(length)); err != nil {
			return fmt.Errorf("answer %q: body: %w", status, err)
		}
		if sip && code < 200 {
			continue
		}
		if !sip && (code < 200 || code > 299) {
			return fmt.Errorf("answer %q: want 2xx", status)
		}
		if br.Buffered() > 0 {
			return fmt.Errorf("answer %q: %d bytes after it", status, br.Buffered())
		}
		return nil
	}
}

// open dials connection i from source src and makes its exchange.
func open(ctx context.Context, c config, i int, src netip.Addr) (held, error) {
	d := net.Dialer{
		Timeout:   c.timeout,
		LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)),
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
			}); err != nil {
				return err
			}
			return serr
		},
	}
	nc, err := d.DialContext(ctx, "tcp", c.addr.String())
	if err != nil {
		return held{}, err
	}
	h := held{tcp: nc.(*net.TCPConn), conn: nc}
	_ = nc.SetDeadline(time.Now().Add(c.timeout))
	if c.tls() {
		cfg := &tls.Config{ServerName: c.host, InsecureSkipVerify: true}
		if !c.sip() {
			cfg.NextProtos = []string{"http/1.1"}
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return held{}, fmt.Errorf("TLS handshake: %w", err)
		}
		h.conn = tc
	}
	if _, err := h.conn.Write(request(c, i)); err != nil {
		h.conn.Close()
		return held{}, err
	}
	if err := readAnswer(bufio.NewReaderSize(h.conn, 1024), c.sip()); err != nil {
		h.conn.Close()
		return held{}, err
	}
	_ = nc.SetDeadline(time.Time{})
	return h, nil
}

// openAll opens c.conns connections, c.parallel at a time; it returns the
// open ones, how many failed and the first failure.
func openAll(ctx context.Context, c config) ([]held, int, error) {
	var (
		next, failed atomic.Int64
		mu           sync.Mutex
		first        error
		wg           sync.WaitGroup
	)
	slots := make([]held, c.conns)
	for range c.parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= c.conns {
					return
				}
				h, err := open(ctx, c, i, c.sources[i%len(c.sources)])
				if err != nil {
					failed.Add(1)
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("connection %d from %s: %w", i, c.sources[i%len(c.sources)], err)
					}
					mu.Unlock()
					continue
				}
				slots[i] = h
			}
		}()
	}
	wg.Wait()
	out := slots[:0]
	for _, h := range slots {
		if h.conn != nil {
			out = append(out, h)
		}
	}
	if n := c.conns - int(next.Load()); n > 0 && ctx.Err() != nil { // never tried: stopped
		failed.Add(int64(min(n, c.conns)))
	}
	return out, int(failed.Load()), first
}

// peek says, without blocking, what a held connection's socket holds:
// closed (EOF or an error: the server closed it) or spoke (bytes wait).
func peek(tc *net.TCPConn) (closed, spoke bool) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return true, false
	}
	var b [1]byte
	var n int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return true
	}); err != nil {
		return true, false
	}
	switch {
	case rerr == unix.EAGAIN:
		return false, false
	case rerr != nil, n == 0:
		return true, false
	}
	return false, true
}

func main() {
	c, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "idleconn:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	start := time.Now()
	hs, failed, first := openAll(ctx, c)
	fmt.Printf("ready open=%d failed=%d secs=%.1f\n", len(hs), failed, time.Since(start).Seconds())
	if first != nil {
		fmt.Fprintln(os.Stderr, "idleconn: first failure:", first)
	}
	t := time.NewTimer(c.hold)
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	closed, spoke := 0, 0
	for _, h := range hs {
		cl, sp := peek(h.tcp)
		if cl {
			closed++
		}
		if sp {
			spoke++
		}
	}
	fmt.Printf("done open=%d closed_by_peer=%d spoke=%d\n", len(hs), closed, spoke)
	for _, h := range hs {
		h.conn.Close()
	}
	if failed > 0 {
		os.Exit(1)
	}
}
