package main

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/proxyproto"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string // "" when valid
	}{
		{[]string{"-addr", "127.0.0.1:80"}, ""},
		{[]string{"-addr", "127.0.0.1:80", "-proxy", "v1", "-rate", "100000", "-conns", "1"}, ""},
		{[]string{"-addr", "10.0.0.1:80"}, "-addr"},
		{[]string{"-addr", "localhost:80"}, "-addr"},
		{[]string{"-addr", "127.0.0.1:80", "-proxy", "v3"}, "-proxy"},
		{[]string{"-addr", "127.0.0.1:80", "-rate", "0"}, "-rate"},
		{[]string{"-addr", "127.0.0.1:80", "-conns", "10001"}, "-conns"},
		{[]string{"-addr", "127.0.0.1:80", "-duration", "11m"}, "-duration"},
		{[]string{"-addr", "127.0.0.1:80", "-timeout", "1ms"}, "-timeout"},
		{[]string{"-addr", "127.0.0.1:80", "-path", "x"}, "-path"},
		{[]string{"-addr", "127.0.0.1:80", "-path", "/a b"}, "-path"},
	} {
		_, err := parseArgs(tc.args)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.err)
		}
	}
}

// server answers each connection once, after reading the header the
// test expects (none, v1, v2) and the request; it records the client
// address each header named and answers status.
type server struct {
	ln      net.Listener
	version uint8
	status  string
	mu      sync.Mutex
	named   []netip.AddrPort
	bad     []string
}

func (s *server) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if s.version != 0 {
				var buf [proxyproto.MaxLen]byte
				h, err := proxyproto.Read(c, buf[:])
				s.mu.Lock()
				if err != nil || h.Version != s.version {
					s.bad = append(s.bad, "header")
				} else if h.Source != c.RemoteAddr().(*net.TCPAddr).AddrPort() {
					s.bad = append(s.bad, "source "+h.Source.String())
				}
				s.named = append(s.named, h.Source)
				s.mu.Unlock()
			}
			br := bufio.NewReader(c)
			line, _ := br.ReadString('\n')
			if !strings.HasPrefix(line, "GET / HTTP/1.1") {
				s.mu.Lock()
				s.bad = append(s.bad, "request "+line)
				s.mu.Unlock()
			}
			io.WriteString(c, "HTTP/1.1 "+s.status+"\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		}()
	}
}

// TestRun: every request is sent with the header asked for, naming the
// connection's own address, and counted by its answer.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		proxy      string
		version    uint8
		status     string
		ok, failed int64
	}{
		{"none", 0, "200 OK", 20, 0},
		{"v1", 1, "200 OK", 20, 0},
		{"v2", 2, "204 No Content", 20, 0},
		{"v2", 2, "503 Service Unavailable", 0, 20},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := &server{ln: ln, version: tc.version, status: tc.status}
		go s.serve()
		c, err := parseArgs([]string{"-addr", ln.Addr().String(), "-proxy", tc.proxy, "-rate", "100", "-conns", "20", "-duration", "200ms"})
		if err != nil {
			t.Fatal(err)
		}
		r := run(c)
		ln.Close()
		// 20 due over 200 ms, 20 workers: none can be late.
		if r.ok.Load() != tc.ok || r.failed.Load() != tc.failed || r.late.Load() != 0 {
			t.Errorf("%s %s: ok %d failed %d late %d, want %d ok, %d failed", tc.proxy, tc.status, r.ok.Load(), r.failed.Load(), r.late.Load(), tc.ok, tc.failed)
		}
		s.mu.Lock()
		if len(s.bad) > 0 {
			t.Errorf("%s: the server saw %v", tc.proxy, s.bad)
		}
		s.mu.Unlock()
	}
}
