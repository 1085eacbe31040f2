package http

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	nethttp "net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// wsEcho is a WebSocket echo backend; any request without an upgrade is
// answered 200 "plain"; /deny answers an upgrade 401.
func wsEcho(t *testing.T, useTLS bool) *httptest.Server {
	t.Helper()
	h := nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		if r.URL.Path == "/deny" {
			nethttp.Error(w, "no", nethttp.StatusUnauthorized)
			return
		}
		if r.Header.Get("Upgrade") == "" {
			io.WriteString(w, "plain upgrade="+r.Header.Get("Upgrade"))
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if string(msg) == "bye" {
				c.Close(websocket.StatusNormalClosure, "bye")
				return
			}
			if err := c.Write(ctx, typ, msg); err != nil {
				return
			}
		}
	})
	var srv *httptest.Server
	if useTLS {
		srv = httptest.NewTLSServer(h)
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	return srv
}

// tunRig serves the backends bs (one pool) with cfg on t's engine.
func tunRig(t testing.TB, cfg Config, bs ...*lb.Backend) (*Server, string) {
	t.Helper()
	pool, err := lb.NewPool(lb.PoolConfig{}, bs)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := admission.NewMemory(admission.MemoryConfig{Limit: 1000}, &fakeMem{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	ctrl, err := admission.NewController(admission.ControllerConfig{}, mem, clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	signer, err := lb.NewSigner([]byte("test key test key test key 32by"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Clock = clock
	if cfg.Engine == "" {
		cfg.Engine = engineOf(t)
	}
	srv, err := New(cfg, Deps{Pool: pool, Admission: ctrl, Signer: signer}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLSConfig != nil {
		go srv.ServeTLS(ln) // an HTTPS listener: cfg.TLSConfig's certificate
	} else {
		go srv.Serve(ln)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv, ln.Addr().String()
}

// plainBackend is an lb.Backend at addr (an httptest URL or host:port).
func plainBackend(t testing.TB, addr string) *lb.Backend {
	t.Helper()
	b, err := lb.NewBackend(lb.BackendConfig{ID: "b0", Addr: strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://"), Proto: "http"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wsDial(t *testing.T, addr, path string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+addr+path, nil)
	if err != nil {
		t.Fatalf("dial %s: %v (answer %v)", path, err, resp)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func wsEchoOnce(t *testing.T, c *websocket.Conn, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	_, got, err := c.Read(ctx)
	if err != nil || string(got) != msg {
		t.Fatalf("echo of %d bytes: got %d bytes, %v", len(msg), len(got), err)
	}
}

func TestWebSocketEcho(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, false)
		srv, addr := tunRig(t, Config{}, plainBackend(t, be.URL))
		c := wsDial(t, addr, "/ws")
		for i := range 20 {
			wsEchoOnce(t, c, fmt.Sprintf("message %d %s", i, strings.Repeat("x", i*1500)))
		}
		st := srv.Stats()
		if engineOf(t) == EngineLoop && st.HandedOver.Load() != 0 {
			t.Fatal("the loop handed the upgrade over: its tunnel should run on the loop")
		}
		if st.Tunnels.Load() != 1 || st.TunnelsTotal.Load() != 1 || st.TunnelsPending.Load() != 0 {
			t.Fatalf("tunnels %d total %d pending %d, want 1 1 0", st.Tunnels.Load(), st.TunnelsTotal.Load(), st.TunnelsPending.Load())
		}
		ts := srv.TunnelStatus()
		if ts.Open != 1 || ts.Total != 1 || ts.Max != 10000 || fmt.Sprint(ts.Upgrades) != "[websocket]" || ts.Idle != "1h0m0s" {
			t.Fatalf("TunnelStatus %+v", ts)
		}
		c.Close(websocket.StatusNormalClosure, "")
		eventually(t, "tunnel uncounted", func() bool { return st.Tunnels.Load() == 0 })
	})
}

// rawExchange writes req on c and reads one answer head and its
// Content-Length body.
func rawAnswer(t *testing.T, br *bufio.Reader) (*nethttp.Response, string) {
	t.Helper()
	resp, err := nethttp.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

const wsUpgradeHead = "GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"

func TestUpgradeRefusedStaysHTTP(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, false)
		srv, addr := tunRig(t, Config{}, plainBackend(t, be.URL))
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		// The upgrade the backend answers 401, and a request pipelined
		// behind it: both are HTTP on the same connection.
		fmt.Fprintf(c, wsUpgradeHead+"GET /next HTTP/1.1\r\nHost: x\r\n\r\n", "/deny")
		if resp, _ := rawAnswer(t, br); resp.StatusCode != 401 {
			t.Fatalf("upgrade answered %d, want 401", resp.StatusCode)
		}
		resp, body := rawAnswer(t, br)
		if resp.StatusCode != 200 || body != "plain upgrade=" {
			t.Fatalf("next request: %d %q", resp.StatusCode, body)
		}
		if st := srv.Stats(); st.TunnelsTotal.Load() != 0 || st.TunnelsPending.Load() != 0 {
			t.Fatalf("tunnels total %d pending %d after a 401", st.TunnelsTotal.Load(), st.TunnelsPending.Load())
		}
	})
}

func TestUpgradeStripped(t *testing.T) {
	cases := []struct {
		name, head string
	}{
		{"h2c", "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"},
		{"post", "POST / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 2\r\n\r\nhi"},
		{"two protocols", "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket, h2c\r\nConnection: Upgrade\r\n\r\n"},
		{"not allowed", "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: irc/6.9\r\nConnection: Upgrade\r\n\r\n"},
		{"no connection token", "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n"},
		{"http/1.0", "GET / HTTP/1.0\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"},
		{"two upgrade lines", "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"},
	}
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, false)
		_, addr := tunRig(t, Config{}, plainBackend(t, be.URL))
		for _, tc := range cases {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, tc.head)
			resp, body := rawAnswer(t, bufio.NewReader(c))
			c.Close()
			if resp.StatusCode != 200 || body != "plain upgrade=" {
				t.Errorf("%s: %d %q, want 200 with no Upgrade at the backend", tc.name, resp.StatusCode, body)
			}
		}
	})
}

func TestUpgradeAllowListFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		err  bool
	}{
		{"websocket", "[websocket]", false},
		{" WebSocket , irc ", "[websocket irc]", false},
		{"none", "[]", false},
		{"h2c", "", true},
		{"websocket,h2c", "", true},
		{"web socket", "", true},
		{",", "", true},
	} {
		got, err := parseUpgrades(tc.in)
		if (err != nil) != tc.err || (err == nil && fmt.Sprint(got) != tc.want) {
			t.Errorf("parseUpgrades(%q) = %v, %v; want %s, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if err != nil && !strings.Contains(err.Error(), "Upgrades") {
			t.Errorf("parseUpgrades(%q): error %q does not name the field", tc.in, err)
		}
	}
}

func TestTunnelClosedByEitherSide(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, false)
		srv, addr := tunRig(t, Config{}, plainBackend(t, be.URL))
		st := srv.Stats()
		// The backend ends it ("bye": close frame, then the connection).
		c := wsDial(t, addr, "/ws")
		wsEchoOnce(t, c, "hello")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.Write(ctx, websocket.MessageText, []byte("bye"))
		if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
			t.Fatalf("after bye: %v, want a normal close from the backend", err)
		}
		eventually(t, "tunnel closed by the backend", func() bool { return st.Tunnels.Load() == 0 })
		// The client ends it: the socket closed without a close frame.
		c2 := wsDial(t, addr, "/ws")
		wsEchoOnce(t, c2, "hello")
		c2.CloseNow()
		eventually(t, "tunnel closed by the client", func() bool { return st.Tunnels.Load() == 0 })
		if st.TunnelsTotal.Load() != 2 {
			t.Fatalf("tunnels total %d, want 2", st.TunnelsTotal.Load())
		}
	})
}

func TestMaxTunnels(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, false)
		srv, addr := tunRig(t, Config{MaxTunnels: 1}, plainBackend(t, be.URL))
		c := wsDial(t, addr, "/ws")
		wsEchoOnce(t, c, "one")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, resp, err := websocket.Dial(ctx, "ws://"+addr+"/ws", nil)
		if err == nil || resp == nil || resp.StatusCode != 503 || !strings.Contains(resp.Header.Get("Proxy-Status"), "tunnels") {
			t.Fatalf("second tunnel: %v %v, want 503 naming tunnels", resp, err)
		}
		if srv.Stats().TunnelsRefused.Load() != 1 {
			t.Fatalf("refused %d, want 1", srv.Stats().TunnelsRefused.Load())
		}
		wsEchoOnce(t, c, "still one")
		c.Close(websocket.StatusNormalClosure, "")
		eventually(t, "slot freed", func() bool { return srv.Stats().Tunnels.Load() == 0 })
		wsEchoOnce(t, wsDial(t, addr, "/ws"), "two")
	})
}

func TestDrainWithOpenTunnels(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, false)
		srv, addr := tunRig(t, Config{}, plainBackend(t, be.URL))
		c := wsDial(t, addr, "/ws")
		wsEchoOnce(t, c, "before")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Shutdown(ctx) }()
		// The drain lets the tunnel run until its deadline (here: cancel).
		wsEchoOnce(t, c, "during the drain")
		select {
		case <-done:
			t.Fatal("Shutdown returned with a tunnel open and its deadline not reached")
		default:
		}
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Shutdown did not return after its deadline")
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		if _, _, err := c.Read(rctx); err == nil {
			t.Fatal("tunnel still open after the drain deadline")
		}
		eventually(t, "tunnel uncounted", func() bool { return srv.Stats().Tunnels.Load() == 0 })
	})
}

// rawUpgradeBackend answers every request with answer (then keeps the
// connection until the client closes it) and counts requests.
func rawUpgradeBackend(t *testing.T, answer string, seen *atomic.Int32) string {
	be := startRawBackend(t, "raw", func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := nethttp.ReadRequest(br)
			if err != nil {
				return
			}
			seen.Add(1)
			io.Copy(io.Discard, req.Body)
			if _, err := io.WriteString(c, answer); err != nil {
				return
			}
		}
	})
	return be.addr()
}

func TestUpgradeSmuggling(t *testing.T) {
	cases := []struct {
		name    string
		request string // the client's first request
		answer  string // the backend's answer to every request
		status  int    // what the client must get
	}{
		// A 101 to a request that asked for no upgrade: the backend
		// connection is no longer HTTP; 502, no tunnel.
		{"101 unasked", "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
			"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n", 502},
		// A 101 to a protocol other than the one asked for.
		{"101 other protocol", fmt.Sprintf(wsUpgradeHead, "/"),
			"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", 502},
		// A non-101 answer followed by bytes: not a tunnel, the extra
		// bytes never reach the client.
		{"bytes after 200", fmt.Sprintf(wsUpgradeHead, "/"),
			"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled", 200},
	}
	onEngines(t, func(t *testing.T) {
		for _, tc := range cases {
			var seen atomic.Int32
			srv, addr := tunRig(t, Config{}, plainBackend(t, rawUpgradeBackend(t, tc.answer, &seen)))
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			io.WriteString(c, tc.request)
			resp, body := rawAnswer(t, br)
			if resp.StatusCode != tc.status {
				t.Errorf("%s: answered %d, want %d", tc.name, resp.StatusCode, tc.status)
			}
			if tc.status == 200 {
				if body != "ok" {
					t.Errorf("%s: body %q", tc.name, body)
				}
				// The next request on the client's connection is a new
				// exchange, answered from the backend afresh.
				io.WriteString(c, "GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
				resp, body := rawAnswer(t, br)
				if resp.StatusCode != 200 || body != "ok" || seen.Load() != 2 {
					t.Errorf("%s: next answer %d %q after %d backend requests, want 200 \"ok\" after 2", tc.name, resp.StatusCode, body, seen.Load())
				}
			}
			if st := srv.Stats(); st.TunnelsTotal.Load() != 0 || st.Tunnels.Load() != 0 {
				t.Errorf("%s: %d tunnels opened", tc.name, st.TunnelsTotal.Load())
			}
			c.Close()
		}
	})
}

// tlsBackend returns an lb.Backend for the TLS test server srv, verified
// with the CA file of ca (a TLS test server whose certificate is the CA).
func tlsBackend(t *testing.T, srv, ca *httptest.Server) *lb.Backend {
	t.Helper()
	file := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate().Raw})
	if err := os.WriteFile(file, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(srv.URL, "https://")
	spec, err := lb.ParseBackendSpec("http", addr+",tls=on,sni=example.com,ca="+file)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := spec.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	b, err := lb.NewBackend(lb.BackendConfig{ID: "tls", Addr: addr, Proto: "http", TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBackendTLS(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, true)
		other := otherCA(t) // a CA that did not sign be's certificate
		b := tlsBackend(t, be, be)
		_, addr := tunRig(t, Config{}, b)
		for range 3 {
			resp, err := nethttp.Get("http://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "plain upgrade=" {
				t.Fatalf("over TLS: %d %q", resp.StatusCode, body)
			}
		}
		wsEchoOnce(t, wsDial(t, addr, "/ws"), "over tls")

		// A backend whose certificate the CA does not sign is refused.
		bad := tlsBackend(t, be, other)
		_, addr2 := tunRig(t, Config{}, bad)
		resp, err := nethttp.Get("http://" + addr2 + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 502 {
			t.Fatalf("wrong CA: %d, want 502", resp.StatusCode)
		}
	})
}

func TestHealthCheckTLS(t *testing.T) {
	be := wsEcho(t, true)
	other := otherCA(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		b      *lb.Backend
		prober lb.Prober
		want   lb.ProbeResult
	}{
		{"http right CA", tlsBackend(t, be, be), lb.HTTPProber{Path: "/"}, lb.ProbeUp},
		{"http wrong CA", tlsBackend(t, be, other), lb.HTTPProber{Path: "/"}, lb.ProbeDown},
		{"tcp right CA", tlsBackend(t, be, be), lb.TCPProber{}, lb.ProbeUp},
		{"tcp wrong CA", tlsBackend(t, be, other), lb.TCPProber{}, lb.ProbeDown},
	} {
		got, err := tc.prober.Probe(ctx, tc.b)
		if got != tc.want {
			t.Errorf("%s: %v (%v), want %v", tc.name, got, err, tc.want)
		}
	}
}

// testCert returns a self-signed certificate for example.com, its own CA.
func testCert(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "other"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, DNSNames: []string{"example.com"},
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// otherCA returns a TLS test server with a certificate of its own
// (httptest's servers all share one), for a CA that signs nothing else.
func otherCA(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nethttp.NotFoundHandler())
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{testCert(t)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// halfCloseBackend switches every upgrade request, echoes what comes
// until the client's EOF, then sends "bye" and closes.
func halfCloseBackend(t testing.TB) string {
	be := startRawBackend(t, "half", func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := nethttp.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		io.Copy(c, br) // echo until the client's half-close
		io.WriteString(c, "bye")
	})
	return be.addr()
}

func TestTunnelHalfClose(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		srv, addr := tunRig(t, Config{}, plainBackend(t, halfCloseBackend(t)))
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		fmt.Fprintf(c, wsUpgradeHead, "/")
		resp, err := nethttp.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 101 || !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
			t.Fatalf("switch: %v %v", resp, err)
		}
		io.WriteString(c, "abc")
		c.(*net.TCPConn).CloseWrite()
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "abcbye" {
			t.Fatalf("after the client's half-close: %q, %v; want the echo, then the backend's last bytes and EOF", rest, err)
		}
		eventually(t, "tunnel uncounted", func() bool { return srv.Stats().Tunnels.Load() == 0 })
	})
}

func TestTunnelIdleTimeout(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, false)
		srv, addr := tunRig(t, Config{TunnelIdle: 50 * time.Millisecond}, plainBackend(t, be.URL))
		c := wsDial(t, addr, "/ws")
		wsEchoOnce(t, c, "hello")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, _, err := c.Read(ctx); err == nil || ctx.Err() != nil {
			t.Fatalf("idle tunnel: %v (deadline %v), want it closed by sluice", err, ctx.Err())
		}
		eventually(t, "tunnel uncounted", func() bool { return srv.Stats().Tunnels.Load() == 0 })
	})
}

func TestTunnelHalfCloseTLSBackend(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		cert := testCert(t)
		be := startRawBackend(t, "half-tls", func(c net.Conn) {
			tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
			br := bufio.NewReader(tc)
			if _, err := nethttp.ReadRequest(br); err != nil {
				return
			}
			io.WriteString(tc, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			io.Copy(tc, br) // until close_notify
			io.WriteString(tc, "bye")
			tc.CloseWrite()
		})
		file := filepath.Join(t.TempDir(), "ca.pem")
		os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600)
		spec, err := lb.ParseBackendSpec("http", be.addr()+",tls=on,sni=example.com,ca="+file)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := spec.ClientTLS()
		if err != nil {
			t.Fatal(err)
		}
		b, err := lb.NewBackend(lb.BackendConfig{ID: "tls", Addr: be.addr(), Proto: "http", TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		_, addr := tunRig(t, Config{}, b)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		fmt.Fprintf(c, wsUpgradeHead, "/")
		if resp, err := nethttp.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
			t.Fatalf("switch: %v %v", resp, err)
		}
		io.WriteString(c, "abc")
		c.(*net.TCPConn).CloseWrite()
		if rest, err := io.ReadAll(br); err != nil || string(rest) != "abcbye" {
			t.Fatalf("after the client's half-close: %q, %v", rest, err)
		}
	})
}

func TestTunnelMetrics(t *testing.T) {
	var st Stats
	st.Tunnels.Store(3)
	st.TunnelsPending.Store(1)
	st.TunnelsTotal.Store(7)
	st.TunnelsRefused.Store(2)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(&st))
	want := `
# HELP sluice_http_tunnels HTTP upgraded connections (WebSocket tunnels) by state: open (the backend answered 101), pending (upgrade request sent, its answer not in yet). Both count against -http-max-tunnels.
# TYPE sluice_http_tunnels gauge
sluice_http_tunnels{state="open"} 3
sluice_http_tunnels{state="pending"} 1
# HELP sluice_http_tunnels_refused_total HTTP upgrade requests answered 503 at -http-max-tunnels, before any backend was contacted.
# TYPE sluice_http_tunnels_refused_total counter
sluice_http_tunnels_refused_total 2
# HELP sluice_http_tunnels_total HTTP tunnels opened (the backend answered 101 with the Upgrade asked for).
# TYPE sluice_http_tunnels_total counter
sluice_http_tunnels_total 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_http_tunnels", "sluice_http_tunnels_total", "sluice_http_tunnels_refused_total"); err != nil {
		t.Fatal(err)
	}
}

// TestTunnelBulkEcho moves 8 MiB each way at once through a tunnel to a
// backend that echoes: every window and every would-block path of both
// directions is crossed many times, and the bytes come back whole and in
// order.
func TestTunnelBulkEcho(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		_, addr := tunRig(t, Config{}, plainBackend(t, halfCloseBackend(t)))
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(c)
		fmt.Fprintf(c, wsUpgradeHead, "/")
		if resp, err := nethttp.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
			t.Fatalf("switch: %v %v", resp, err)
		}
		data := make([]byte, 8<<20)
		rand.Read(data)
		werr := make(chan error, 1)
		go func() {
			_, err := c.Write(data)
			c.(*net.TCPConn).CloseWrite()
			werr <- err
		}()
		got, err := io.ReadAll(br)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
		if len(got) != len(data)+3 || !bytes.Equal(got[:len(data)], data) || string(got[len(data):]) != "bye" {
			t.Fatalf("echo of %d bytes came back as %d bytes, not equal", len(data), len(got))
		}
	})
}

// BenchmarkTunnelEcho is one 64-byte round trip over an open tunnel to
// an echoing backend, per engine.
func BenchmarkTunnelEcho(b *testing.B) {
	for _, v := range suiteVariants {
		b.Run(v.name, func(b *testing.B) {
			_, addr := tunRig(b, Config{Engine: v.engine, IOURing: v.ring}, plainBackend(b, halfCloseBackend(b)))
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			fmt.Fprintf(c, wsUpgradeHead, "/")
			if resp, err := nethttp.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
				b.Fatalf("switch: %v %v", resp, err)
			}
			msg := make([]byte, 64)
			got := make([]byte, 64)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(br, got); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestWebSocketLargeHead opens a tunnel with a 10 KB request head (the
// loop grows its buffer for it, and the tunnel gives it back).
func TestWebSocketLargeHead(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, false)
		_, addr := tunRig(t, Config{}, plainBackend(t, be.URL))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h := nethttp.Header{}
		h.Set("X-Big", strings.Repeat("b", 10000))
		c, _, err := websocket.Dial(ctx, "ws://"+addr+"/ws", &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		for i := range 5 {
			wsEchoOnce(t, c, strings.Repeat("m", i*6000))
		}
	})
}

// TestUpgradeNone: with -http-upgrade none no upgrade is forwarded.
func TestUpgradeNone(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		be := wsEcho(t, false)
		srv, addr := tunRig(t, Config{Upgrades: "none"}, plainBackend(t, be.URL))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, resp, err := websocket.Dial(ctx, "ws://"+addr+"/ws", nil)
		if err == nil || resp == nil || resp.StatusCode != 200 {
			t.Fatalf("upgrade with none allowed: %v %v, want the backend's plain 200", resp, err)
		}
		if st := srv.Stats(); st.TunnelsTotal.Load() != 0 {
			t.Fatalf("%d tunnels opened", st.TunnelsTotal.Load())
		}
	})
}

// TestTunnelOverHTTPS: a WebSocket through the HTTPS listener, on both
// engines: the backend gets the plaintext of the client's records (the
// loop engine once sent it the records themselves), both ways, for small
// messages and 8 MiB each way; the client's close_notify ends its side as
// a FIN does, and the backend's end reaches the client as a close_notify.
func TestTunnelOverHTTPS(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		pki := testTLS(t)
		be := wsEcho(t, false)
		_, addr := tunRig(t, Config{TLSConfig: pki.server()}, plainBackend(t, be.URL))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		hc := &nethttp.Client{Transport: &nethttp.Transport{TLSClientConfig: pki.client("a.example"),
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}}}
		c, resp, err := websocket.Dial(ctx, "wss://a.example/ws", &websocket.DialOptions{HTTPClient: hc})
		if err != nil {
			t.Fatalf("dial over HTTPS: %v (answer %v)", err, resp)
		}
		defer c.CloseNow()
		for i := range 20 {
			wsEchoOnce(t, c, fmt.Sprintf("message %d %s", i, strings.Repeat("x", i*1500)))
		}
		c.Close(websocket.StatusNormalClosure, "")

		_, addr = tunRig(t, Config{TLSConfig: pki.server()}, plainBackend(t, halfCloseBackend(t)))
		tc, err := tls.Dial("tcp", addr, pki.client("a.example"))
		if err != nil {
			t.Fatal(err)
		}
		defer tc.Close()
		tc.SetDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(tc)
		fmt.Fprintf(tc, wsUpgradeHead, "/")
		if resp, err := nethttp.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
			t.Fatalf("switch: %v %v", resp, err)
		}
		data := make([]byte, 8<<20)
		rand.Read(data)
		werr := make(chan error, 1)
		go func() {
			_, err := tc.Write(data)
			if err == nil {
				err = tc.CloseWrite() // close_notify
			}
			werr <- err
		}()
		got, err := io.ReadAll(br)
		if err != nil {
			t.Fatalf("read the echo: %v (the backend's end should arrive as a close_notify)", err)
		}
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
		if len(got) != len(data)+3 || !bytes.Equal(got[:len(data)], data) || string(got[len(data):]) != "bye" {
			t.Fatalf("echo of %d bytes over HTTPS came back as %d bytes, not equal", len(data), len(got))
		}
	})
}
