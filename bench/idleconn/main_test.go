package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string // "" when valid
	}{
		{[]string{"-addr", "127.0.0.1:80"}, ""},
		{[]string{"-addr", "127.0.0.1:80", "-proto", "sip", "-conns", "1000000", "-sources", "127.0.0.2-127.0.0.9"}, ""},
		{[]string{"-addr", "127.0.0.1:80", "-proto", "https", "-sources", "127.0.0.2,127.0.0.3"}, ""},
		{[]string{"-addr", "[::1]:80", "-sources", "::1"}, ""},
		{[]string{"-addr", "10.0.0.1:80"}, "-addr"},
		{[]string{"-addr", "localhost:80"}, "-addr"},
		{[]string{"-addr", "127.0.0.1:80", "-proto", "ws"}, "-proto"},
		{[]string{"-addr", "127.0.0.1:80", "-sources", "10.0.0.2"}, "-sources"},
		{[]string{"-addr", "127.0.0.1:80", "-sources", "127.0.0.9-127.0.0.2"}, "-sources"},
		{[]string{"-addr", "127.0.0.1:80", "-sources", "127.0.0.2-127.0.1.9"}, "-sources"},
		{[]string{"-addr", "127.0.0.1:80", "-sources", "::1"}, "-sources"},
		{[]string{"-addr", "127.0.0.1:80", "-conns", "0"}, "-conns"},
		{[]string{"-addr", "127.0.0.1:80", "-conns", "1000001"}, "-conns"},
		{[]string{"-addr", "127.0.0.1:80", "-parallel", "5000"}, "-parallel"},
		{[]string{"-addr", "127.0.0.1:80", "-timeout", "1ms"}, "-timeout"},
		{[]string{"-addr", "127.0.0.1:80", "-hold", "25h"}, "-hold"},
		{[]string{"-addr", "127.0.0.1:80", "-path", "x"}, "-path"},
		{[]string{"-addr", "127.0.0.1:80", "-host", "a b"}, "-host"},
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

func TestParseSourcesRange(t *testing.T) {
	got, err := parseSources("127.0.0.2-127.0.0.9")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 || got[0] != netip.MustParseAddr("127.0.0.2") || got[7] != netip.MustParseAddr("127.0.0.9") {
		t.Fatalf("got %v, want 127.0.0.2 .. 127.0.0.9", got)
	}
}

func TestReadAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		sip      bool
		err      string // "" when accepted
	}{
		{"http 200 with body", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nb1\n", false, ""},
		{"http 204 no length", "HTTP/1.1 204 No Content\r\n\r\n", false, ""},
		{"http 503", "HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", false, "want 2xx"},
		{"http chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false, "Transfer-Encoding"},
		{"http bytes after", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nX", false, "bytes after"},
		{"http short body", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab", false, "body"},
		{"http bad length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false, "Content-Length"},
		{"sip as http", "SIP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", false, "not the protocol"},
		{"sip 200", "SIP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", true, ""},
		{"sip 483 compact length", "SIP/2.0 483 Too Many Hops\r\nl: 0\r\n\r\n", true, ""},
		{"sip 100 then 200", "SIP/2.0 100 Trying\r\nContent-Length: 0\r\n\r\nSIP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", true, ""},
		{"sip keep-alive first", "\r\nSIP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", true, ""},
		{"sip no status code", "SIP/2.0 OK\r\n\r\n", true, "no status code"},
		{"eof", "HTTP/1.1 200", false, "head"},
	} {
		err := readAnswer(bufio.NewReader(strings.NewReader(tc.in)), tc.sip)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.err)
		}
	}
}

// server answers each connection's first request (HTTP or SIP) once and
// records its source address, its request line and the connection, which
// the test then closes or writes on.
type server struct {
	ln    net.Listener
	sip   bool
	mu    sync.Mutex
	srcs  map[netip.Addr]int
	conns []net.Conn
	reqs  []string
}

func (s *server) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			br := bufio.NewReader(c)
			line, err := br.ReadString('\n')
			if err != nil {
				c.Close()
				return
			}
			for {
				l, err := br.ReadString('\n')
				if err != nil || l == "\r\n" {
					break
				}
			}
			ans := "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"
			if s.sip {
				ans = "SIP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n"
			}
			s.mu.Lock()
			s.srcs[c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()]++
			s.conns = append(s.conns, c)
			s.reqs = append(s.reqs, line)
			s.mu.Unlock()
			_, _ = c.Write([]byte(ans))
		}()
	}
}

// selfSigned is a TLS server configuration with a fresh ECDSA P-256
// certificate for localhost.
func selfSigned(t *testing.T) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, NotBefore: time.Unix(0, 0), NotAfter: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

func TestOpenHoldPeek(t *testing.T) {
	for _, proto := range []string{"http", "sip", "https", "sips"} {
		t.Run(proto, func(t *testing.T) {
			var ln net.Listener
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			overTLS := proto == "https" || proto == "sips"
			if overTLS {
				ln = tls.NewListener(ln, selfSigned(t))
			}
			s := &server{ln: ln, sip: strings.HasPrefix(proto, "sip"), srcs: map[netip.Addr]int{}}
			go s.serve()
			c, err := parseArgs([]string{"-addr", ln.Addr().String(), "-proto", proto, "-conns", "20",
				"-sources", "127.0.0.1-127.0.0.2", "-parallel", "4"})
			if err != nil {
				t.Fatal(err)
			}
			hs, failed, first := openAll(context.Background(), c)
			if len(hs) != 20 || failed != 0 || first != nil {
				t.Fatalf("open %d failed %d (%v), want 20 open", len(hs), failed, first)
			}
			defer func() {
				for _, h := range hs {
					h.conn.Close()
				}
			}()
			s.mu.Lock()
			srcs := s.srcs
			want := "GET / HTTP/1.1\r\n"
			if s.sip {
				want = "OPTIONS sip:edge.invalid SIP/2.0\r\n"
			}
			for _, r := range s.reqs {
				if r != want {
					t.Errorf("server read %q, want %q", r, want)
				}
			}
			s.mu.Unlock()
			if srcs[netip.MustParseAddr("127.0.0.1")] != 10 || srcs[netip.MustParseAddr("127.0.0.2")] != 10 {
				t.Fatalf("sources %v, want 10 from each of 127.0.0.1 and 127.0.0.2", srcs)
			}
			for _, h := range hs {
				if cl, sp := peek(h.tcp); cl || sp {
					t.Fatalf("an idle connection peeks closed=%v spoke=%v", cl, sp)
				}
			}
			if overTLS {
				// A TLS server's close writes its close_notify first, so
				// peek tells it only as spoke: the plain cases check closed.
				return
			}
			// The server closes 5 and writes on 3 others: peek must tell.
			s.mu.Lock()
			for _, sc := range s.conns[:5] {
				sc.Close()
			}
			for _, sc := range s.conns[5:8] {
				_, _ = sc.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n"))
			}
			s.mu.Unlock()
			var closed, spoke int
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				closed, spoke = 0, 0
				for _, h := range hs {
					cl, sp := peek(h.tcp)
					if cl {
						closed++
					}
					if sp {
						spoke++
					}
				}
				if closed == 5 && spoke == 3 {
					break
				}
			}
			if closed != 5 || spoke != 3 {
				t.Fatalf("peek: closed %d spoke %d, want 5 and 3", closed, spoke)
			}
		})
	}
}

func TestOpenFailsOnRefusedAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n"))
			c.Close()
		}
	}()
	c, err := parseArgs([]string{"-addr", ln.Addr().String(), "-conns", "3", "-parallel", "1"})
	if err != nil {
		t.Fatal(err)
	}
	hs, failed, first := openAll(context.Background(), c)
	if len(hs) != 0 || failed != 3 || first == nil || !strings.Contains(first.Error(), "want 2xx") {
		t.Fatalf("open %d failed %d first %v, want 0 open, 3 failed on the 503", len(hs), failed, first)
	}
}
