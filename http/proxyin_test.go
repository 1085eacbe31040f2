package http

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	nethttp "net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/sluicelb/sluice/proxyproto"
)

// proxyExchange dials addr, writes pre (a PROXY header, or anything),
// then, when secure, a TLS handshake, then one GET; it returns the
// answer's status, or 0 when the connection was closed unanswered.
func proxyExchange(t *testing.T, addr string, pre []string, secure bool) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for _, p := range pre {
		if _, err := io.WriteString(c, p); err != nil {
			return 0
		}
	}
	var rw net.Conn = c
	if secure {
		tc := tls.Client(c, testTLS(t).client("a.example"))
		if tc.Handshake() != nil {
			return 0
		}
		rw = tc
	}
	if _, err := io.WriteString(rw, "GET /pp HTTP/1.1\r\nHost: a.example\r\n\r\n"); err != nil {
		return 0
	}
	resp, err := nethttp.ReadResponse(bufio.NewReader(rw), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestProxyProtocolIn(t *testing.T) {
	src := netip.MustParseAddrPort("203.0.113.7:40000")
	dst := netip.MustParseAddrPort("127.0.0.1:8080")
	v1 := string(proxyproto.AppendV1(nil, src, dst))
	v2 := string(proxyproto.AppendV2(nil, src, dst))
	local := string(proxyproto.AppendV2(nil, netip.AddrPort{}, netip.AddrPort{}))
	tests := []struct {
		name   string
		from   string   // -proxy-protocol-from
		pre    []string // written before the request (each piece its own write)
		status int      // 0: closed unanswered
		xff    string   // X-Forwarded-For the backend sees
		reason string   // the refusal counted
	}{
		{name: "v2", from: "127.0.0.0/8", pre: []string{v2}, status: 200, xff: "203.0.113.7"},
		{name: "v1", from: "127.0.0.1/32", pre: []string{v1}, status: 200, xff: "203.0.113.7"},
		{name: "v2 in pieces", from: "127.0.0.0/8", pre: []string{v2[:3], v2[3:14], v2[14:]}, status: 200, xff: "203.0.113.7"},
		{name: "v1 in pieces", from: "127.0.0.0/8", pre: []string{v1[:1], v1[1:20], v1[20:]}, status: 200, xff: "203.0.113.7"},
		{name: "local keeps the peer", from: "127.0.0.0/8", pre: []string{local}, status: 200, xff: "127.0.0.1"},
		{name: "unknown keeps the peer", from: "127.0.0.0/8", pre: []string{"PROXY UNKNOWN\r\n"}, status: 200, xff: "127.0.0.1"},
		{name: "missing", from: "127.0.0.0/8", status: 0, reason: proxyproto.ReasonMissing},
		{name: "malformed", from: "127.0.0.0/8", pre: []string{"PROXY TCP4 203.0.113.7 127.0.0.1 40000 99999\r\n"}, status: 0, reason: proxyproto.ReasonMalformed},
		{name: "forged v1 from an untrusted source", from: "10.0.0.0/8", pre: []string{v1}, status: 0, reason: proxyproto.ReasonUntrusted},
		{name: "forged v2 from an untrusted source", from: "10.0.0.0/8", pre: []string{v2}, status: 0, reason: proxyproto.ReasonUntrusted},
		{name: "untrusted without header", from: "10.0.0.0/8", status: 200, xff: "127.0.0.1"},
	}
	onEngines(t, func(t *testing.T) {
		for _, secure := range []bool{false, true} {
			for _, tc := range tests {
				name := tc.name
				if secure {
					name = "https " + name
				}
				t.Run(name, func(t *testing.T) {
					r := newRig(t, rigOpts{backends: 1, tls: secure, cfg: Config{ProxyFrom: []netip.Prefix{netip.MustParsePrefix(tc.from)}}})
					got := proxyExchange(t, r.addr, tc.pre, secure)
					if got != tc.status {
						t.Fatalf("status %d, want %d", got, tc.status)
					}
					if tc.status == 200 {
						if xff := r.backends[0].lastHeaders()["X-Forwarded-For"]; len(xff) != 1 || xff[0] != tc.xff {
							t.Fatalf("backend saw X-Forwarded-For %q, want %q", xff, tc.xff)
						}
					}
					if tc.reason != "" {
						if !waitFor(func() bool { return r.srv.Stats().ProxyRejected.Get(tc.reason) == 1 }) {
							t.Fatal("refusal not counted")
						}
					}
				})
			}
		}
	})
}

// TestProxyProtocolInTimeoutAndTruncated: a header cut by the client's
// close is counted truncated; one that stops coming is closed at
// -proxy-protocol-timeout and counted.
func TestProxyProtocolInTimeoutAndTruncated(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, cfg: Config{ProxyFrom: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, ProxyTimeout: 50 * time.Millisecond}})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "PROXY TCP4 1.2.3.4")
		c.Close()
		if !waitFor(func() bool { return r.srv.Stats().ProxyRejected.Get(proxyproto.ReasonTruncated) == 1 }) {
			t.Fatal("refusal not counted")
		}

		c, err = net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "PROXY TCP4 1.2.3.4")
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || strings.Contains(err.Error(), "timeout") {
			t.Fatalf("read %d %v, want the connection closed by sluice", n, err)
		}
		if !waitFor(func() bool { return r.srv.Stats().ProxyRejected.Get(proxyproto.ReasonTimeout) == 1 }) {
			t.Fatal("refusal not counted")
		}
	})
}

// TestProxyProtocolPerSourceLimit: behind a balancer the per-source limit
// counts the clients its headers name, not the balancer.
func TestProxyProtocolPerSourceLimit(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, cfg: Config{ProxyFrom: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, MaxConnsPerSource: 1}})
		hdr := func(ip string) string {
			return string(proxyproto.AppendV2(nil, netip.MustParseAddrPort(ip+":1000"), netip.MustParseAddrPort("127.0.0.1:80")))
		}
		// One client held open...
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, hdr("198.51.100.1")+"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if resp, err := nethttp.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("first client: %v %v", resp, err)
		}
		// ...another client through the same balancer is served...
		if got := proxyExchange(t, r.addr, []string{hdr("198.51.100.2")}, false); got != 200 {
			t.Fatalf("second client: status %d, want 200", got)
		}
		// ...the first client's second connection is over its limit...
		if got := proxyExchange(t, r.addr, []string{hdr("198.51.100.1")}, false); got != 0 {
			t.Fatalf("first client's second connection: status %d, want closed", got)
		}
		// ...until its first one closes: the count follows the client.
		c.Close()
		if !waitFor(func() bool { return proxyExchange(t, r.addr, []string{hdr("198.51.100.1")}, false) == 200 }) {
			t.Fatal("the first client's count was not released when its connection closed")
		}
	})
}

// BenchmarkProxyConnSetup is a GET on a new connection per request (the
// client's connection setup is the cost measured), with no PROXY header,
// and with a v1 or v2 header from a -proxy-protocol-from client, per
// engine; the backend connection is kept alive throughout.
func BenchmarkProxyConnSetup(b *testing.B) {
	src, dst := netip.MustParseAddrPort("203.0.113.7:40000"), netip.MustParseAddrPort("127.0.0.1:80")
	for _, engine := range []string{EngineLoop, EngineFastHTTP} {
		for _, tc := range []struct {
			name string
			hdr  []byte
		}{{"off", nil}, {"v1", proxyproto.AppendV1(nil, src, dst)}, {"v2", proxyproto.AppendV2(nil, src, dst)}} {
			b.Run(engine+"/"+tc.name, func(b *testing.B) {
				cfg := Config{Engine: engine}
				if tc.hdr != nil {
					cfg.ProxyFrom = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
				}
				r := newRig(b, rigOpts{backends: 1, cfg: cfg})
				req := append(append([]byte{}, tc.hdr...), "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"...)
				buf := make([]byte, 4096)
				b.ReportAllocs()
				for b.Loop() {
					c, err := net.Dial("tcp", r.addr)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.Write(req); err != nil {
						b.Fatal(err)
					}
					n := 0
					for {
						m, err := c.Read(buf[n:])
						n += m
						if err != nil {
							break
						}
					}
					if !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200") {
						b.Fatalf("answer %q", buf[:n])
					}
					c.Close()
				}
			})
		}
	}
}

// TestProxyProtocolH2C: the h2c listener reads a balancer's header too;
// the HTTP/2 requests on the connection are the named client's.
func TestProxyProtocolH2C(t *testing.T) {
	r := newRig(t, rigOpts{backends: 1, cfg: Config{ProxyFrom: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	addr := h2cListen(t, r)
	hdr := proxyproto.AppendV2(nil, netip.MustParseAddrPort("203.0.113.9:4444"), netip.MustParseAddrPort("127.0.0.1:80"))
	tr := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err == nil {
				_, err = c.Write(hdr)
			}
			return c, err
		},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&nethttp.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if xff := r.backends[0].lastHeaders()["X-Forwarded-For"]; resp.StatusCode != 200 || len(xff) != 1 || xff[0] != "203.0.113.9" {
		t.Fatalf("status %d, backend X-Forwarded-For %q, want 200 and 203.0.113.9", resp.StatusCode, xff)
	}
	// Without a header the balancer's connection is closed.
	if _, err := h2cClient(t).Get("http://" + addr + "/"); err == nil {
		t.Fatal("an h2c connection from the balancer without a header was served")
	}
	if !waitFor(func() bool { return r.srv.Stats().ProxyRejected.Get(proxyproto.ReasonMissing) >= 1 }) {
		t.Fatal("missing header not counted")
	}
}
