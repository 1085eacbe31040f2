package sip

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
	"github.com/gobwas/ws"
)

// testTLS returns a server configuration with a self-signed certificate
// for 127.0.0.1 and sip.test, and a client configuration trusting it.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "sip.test"},
		DNSNames:     []string{"sip.test"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}}}
	client = &tls.Config{RootCAs: pool, ServerName: "sip.test"}
	return server, client
}

// edgeServer is a test server with TLS, WS and WSS listeners on loopback
// and the client TLS configuration that trusts it.
func edgeServer(t testing.TB, backends []*uas, mut func(*Config)) (*Server, *tls.Config) {
	t.Helper()
	srv, cli := testTLS(t)
	s := testServer(t, backends, nil, func(c *Config) {
		c.TLSListen, c.WSListen, c.WSSListen = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		c.TLSConfig = srv
		if mut != nil {
			mut(c)
		}
	})
	return s, cli
}

// dialTLS is a SIP over TLS client.
func dialTLS(t *testing.T, s *Server, cfg *tls.Config) *tcpClient {
	t.Helper()
	c, err := tls.Dial("tcp", s.TLSAddr().String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &tcpClient{t: t, conn: c}
}

// wsClient is a SIP over WebSocket client that frames by hand, so tests
// can send any frame.
type wsClient struct {
	t    *testing.T
	conn net.Conn
}

// dialWS opens a WebSocket (WSS with cfg) to addr offering the
// subprotocol sip.
func dialWS(t *testing.T, addr net.Addr, cfg *tls.Config) *wsClient {
	t.Helper()
	scheme := "ws"
	if cfg != nil {
		scheme = "wss"
	}
	d := ws.Dialer{Protocols: []string{"sip"}, TLSConfig: cfg, Timeout: wait}
	c, _, hs, err := d.Dial(t.Context(), fmt.Sprintf("%s://%s/", scheme, addr))
	if err != nil {
		t.Fatal(err)
	}
	if hs.Protocol != "sip" {
		t.Fatalf("subprotocol %q, want sip", hs.Protocol)
	}
	t.Cleanup(func() { c.Close() })
	return &wsClient{t: t, conn: c}
}

// frame writes one masked frame.
func (c *wsClient) frame(op ws.OpCode, fin bool, p []byte) {
	c.t.Helper()
	f := ws.MaskFrame(ws.NewFrame(op, fin, append([]byte(nil), p...)))
	if err := ws.WriteFrame(c.conn, f); err != nil {
		c.t.Fatal(err)
	}
}

// text sends msg (LF made CRLF) in one text frame.
func (c *wsClient) text(msg string) {
	c.t.Helper()
	c.frame(ws.OpText, true, []byte(crlf(msg)))
}

func crlf(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\n", "\r\n")
}

// read returns the next frame from the server (unmasked; a server never
// masks), or the read error.
func (c *wsClient) read() (ws.Frame, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	f, err := ws.ReadFrame(c.conn)
	if err == nil && f.Header.Masked {
		c.t.Errorf("server frame masked")
	}
	return f, err
}

// response returns the next SIP response with code (skipping 100 and
// answers of other codes below min), failing the test on any other.
func (c *wsClient) response(code int) *gosip.Response {
	c.t.Helper()
	for {
		f, err := c.read()
		if err != nil {
			c.t.Fatalf("waiting for %d: %v", code, err)
		}
		if !f.Header.OpCode.IsData() {
			continue
		}
		m, err := gosip.ParseMessage(f.Payload)
		if err != nil {
			c.t.Fatalf("unparsable message: %v\n%s", err, f.Payload)
		}
		res, ok := m.(*gosip.Response)
		if !ok || res.StatusCode == 100 {
			continue
		}
		if res.StatusCode != code {
			c.t.Fatalf("got %d %s, want %d", res.StatusCode, res.Reason, code)
		}
		return res
	}
}

// closeCode reads frames until a Close and returns its status code; -1
// when the connection ended without one.
func (c *wsClient) closeCode() int {
	c.t.Helper()
	for {
		f, err := c.read()
		if err != nil {
			return -1
		}
		if f.Header.OpCode == ws.OpClose {
			code, _ := ws.ParseCloseFrameData(f.Payload)
			return int(code)
		}
	}
}

// wsReq builds a request from a WebSocket client as JsSIP writes them:
// Via SIP/2.0/WS (or WSS) with an .invalid host, Contact at that host.
func wsReq(method, transport, callID, branch string, cseq int, toTag, routes, body string) string {
	to := "<sip:bob@test>"
	if toTag != "" {
		to += ";tag=" + toTag
	}
	ctype := ""
	if body != "" {
		ctype = "Content-Type: application/sdp\r\n"
	}
	return fmt.Sprintf("%s sip:bob@test SIP/2.0\r\nVia: SIP/2.0/%s df7jal23ls0d.invalid;branch=%s\r\nMax-Forwards: 70\r\n%sFrom: <sip:alice@test>;tag=ws-a\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContact: <sip:alice@df7jal23ls0d.invalid;transport=ws>\r\n%sContent-Length: %d\r\n\r\n%s",
		method, transport, branch, routes, to, callID, cseq, method, ctype, len(body), body)
}

// testGate is a HandshakeGate of at most max handshakes in progress.
type testGate struct {
	max      int64
	inFlight atomic.Int64
	mu       sync.Mutex
	acquired int
}

func (g *testGate) Acquire(int64) bool {
	if g.inFlight.Add(1) > g.max {
		g.inFlight.Add(-1)
		return false
	}
	g.mu.Lock()
	g.acquired++
	g.mu.Unlock()
	return true
}

func (g *testGate) Release() { g.inFlight.Add(-1) }
