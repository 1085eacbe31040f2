package sip

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/internal/testenv"
	"github.com/sluicelb/sluice/proxyproto"
)

// proxyUAS is a SIP backend over TCP that, as Kamailio with
// tcp_accept_haproxy=yes, reads a PROXY header at the start of every
// connection and takes the connection's messages as from the client it
// names. It answers INVITE 180 and 200, anything else but ACK 200.
type proxyUAS struct {
	addr string
	// allowPlain: a connection without a header is held open, unread
	// (counted in plain), instead of failing the test.
	allowPlain bool
	plain      int
	mu         sync.Mutex
	hdrs       []proxyproto.Header      // by connection, in accept order
	reqs       map[string][]proxyUASReq // by Call-ID
}

// proxyUASReq is one request as the backend got it.
type proxyUASReq struct {
	method gosip.RequestMethod
	conn   int // index in hdrs
}

func newProxyUAS(t *testing.T, allowPlain bool) *proxyUAS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &proxyUAS{addr: ln.Addr().String(), reqs: map[string][]proxyUASReq{}, allowPlain: allowPlain}
	var wg sync.WaitGroup
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(wait))
			h, err := proxyproto.Read(c, nil)
			_ = c.SetReadDeadline(time.Time{})
			if err != nil && u.allowPlain {
				u.mu.Lock()
				u.plain++
				conns = append(conns, c)
				u.mu.Unlock()
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = io.Copy(io.Discard, c) }()
				continue
			}
			if err != nil {
				t.Errorf("backend: connection without a PROXY header: %v", err)
				c.Close()
				continue
			}
			u.mu.Lock()
			u.hdrs = append(u.hdrs, h)
			conns = append(conns, c)
			i := len(u.hdrs) - 1
			u.mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); u.serve(c, i) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		u.mu.Unlock()
		wg.Wait()
	})
	return u
}

func (u *proxyUAS) serve(c net.Conn, conn int) {
	var buf []byte
	chunk := make([]byte, 4096)
	for {
		n, err := c.Read(chunk)
		if err != nil {
			return
		}
		buf = append(buf, chunk[:n]...)
		for {
			size, ok, ferr := frame(buf, 1<<20)
			if ferr != nil || !ok {
				break
			}
			m, perr := gosip.ParseMessage(append([]byte(nil), buf[:size]...))
			buf = buf[size:]
			req, isReq := m.(*gosip.Request)
			if perr != nil || !isReq {
				continue
			}
			u.mu.Lock()
			u.reqs[req.CallID().Value()] = append(u.reqs[req.CallID().Value()], proxyUASReq{req.Method, conn})
			u.mu.Unlock()
			answer := func(code int, reason string) {
				res := gosip.NewResponseFromRequest(req, code, reason, nil)
				res.To().Params.Add("tag", "puas")
				res.AppendHeader(&gosip.ContactHeader{Address: gosip.Uri{Scheme: "sip", Host: "127.0.0.1", UriParams: gosip.HeaderParams{{K: "transport", V: "tcp"}}}})
				_, _ = c.Write([]byte(res.String()))
			}
			switch req.Method {
			case gosip.ACK:
			case gosip.INVITE:
				answer(180, "Ringing")
				answer(200, "OK")
			default:
				answer(200, "OK")
			}
		}
	}
}

// header returns the PROXY header of connection i.
func (u *proxyUAS) header(i int) proxyproto.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hdrs[i]
}

// got returns the requests of callID, in order.
func (u *proxyUAS) got(callID string) []proxyUASReq {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]proxyUASReq(nil), u.reqs[callID]...)
}

func (u *proxyUAS) conns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.hdrs)
}

// TestProxyProtocolOutSIP: two UDP clients, at 127.0.0.2 and 127.0.0.3,
// call through sluice to a backend with proxy=v2 and proxy=v1: each gets
// a connection of its own whose header names it (address and port), all
// of its requests (INVITE, ACK, BYE) go over it and the answers reach it;
// the shared connection opened at start names no client.
func TestProxyProtocolOutSIP(t *testing.T) {
	for _, v := range []uint8{1, 2} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			be := newProxyUAS(t, false)
			s := testServer(t, nil, nil, func(c *Config) {
				c.Backends = []BackendConfig{{ID: "k1", Addr: be.addr, Transport: "tcp", Weight: 1, Proxy: v}}
			})
			eventually(t, "the shared connection", func() bool { return be.conns() == 1 })
			if h := be.header(0); h.Version != v || h.Source.IsValid() {
				t.Fatalf("shared connection header %+v: want v%d naming no client", h, v)
			}
			clients := []*uac{newUACAt(t, s.udpAddr(), "127.0.0.2"), newUACAt(t, s.udpAddr(), "127.0.0.3")}
			calls := make([]*call, len(clients))
			for i, c := range clients {
				k := c.newCall()
				calls[i] = k
				k.invite("")
				c.recvResponse(180)
				k.learn(c.recvResponse(200))
				k.inDialog("ACK", 1, k.branch+"-ack")
				k.inDialog("BYE", 2, k.branch+"-bye")
				c.recvResponseTo(gosip.BYE, 200)
			}
			if n := be.conns(); n != 3 {
				t.Fatalf("backend connections %d, want 3 (shared, one per client)", n)
			}
			for i, k := range calls {
				var got []proxyUASReq
				eventually(t, "INVITE, ACK and BYE at the backend", func() bool { got = be.got(k.callID); return len(got) >= 3 })
				conn := got[0].conn
				var methods []string
				for _, r := range got {
					methods = append(methods, string(r.method))
					if r.conn != conn {
						t.Errorf("client %d: %s on connection %d, INVITE on %d", i, r.method, r.conn, conn)
					}
				}
				if strings.Join(methods, ",") != "INVITE,ACK,BYE" {
					t.Errorf("client %d: backend got %v", i, methods)
				}
				h := be.header(conn)
				if h.Version != v || h.Command != proxyproto.Proxy || h.Source != clients[i].addr {
					t.Errorf("client %d: header %+v, want v%d naming %s", i, h, v, clients[i].addr)
				}
				if want := netip.MustParseAddrPort(be.addr); h.Dest != want {
					t.Errorf("client %d: header destination %s, want the backend %s", i, h.Dest, want)
				}
			}
			if n := s.proxied.len(); n != 2 {
				t.Errorf("per-client connections %d, want 2", n)
			}
		})
	}
}

// TestProxyProtocolOutSIPBound: past the bound of per-client connections
// (per client address, per backend) a new client gets 503 with a Warning,
// counted, and no connection is opened for it.
func TestProxyProtocolOutSIPBound(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		maxBackend, maxSouce int
		ips                  []string // clients in order; the last is refused
	}{
		{"per source", 10, 1, []string{"127.0.0.2", "127.0.0.3", "127.0.0.2"}},
		{"per backend", 2, 10, []string{"127.0.0.2", "127.0.0.3", "127.0.0.2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := newProxyUAS(t, false)
			s := testServer(t, nil, nil, func(c *Config) {
				c.Backends = []BackendConfig{{ID: "k1", Addr: be.addr, Transport: "tcp", Weight: 1, Proxy: 2}}
			})
			s.proxied.mu.Lock()
			s.proxied.maxBackend, s.proxied.maxSource = tc.maxBackend, tc.maxSouce
			s.proxied.mu.Unlock()
			eventually(t, "the shared connection", func() bool { return be.conns() == 1 })
			for i, ip := range tc.ips {
				c := newUACAt(t, s.udpAddr(), ip)
				k := c.newCall()
				k.invite("")
				if i < len(tc.ips)-1 {
					c.recvResponse(180)
					c.recvResponse(200)
					continue
				}
				res := c.recvResponse(503)
				if w := res.GetHeader("Warning"); w == nil || !strings.Contains(w.Value(), "backend connections exhausted") {
					t.Errorf("503 Warning %v, want backend connections exhausted", w)
				}
				if n := len(be.got(k.callID)); n != 0 {
					t.Errorf("backend got %d requests of the refused call", n)
				}
			}
			if n := s.metrics.BackendProxyConnsRefused.Load(); n != 1 {
				t.Errorf("backend_proxy_conns_refused %d, want 1", n)
			}
			if n := be.conns(); n != len(tc.ips) {
				t.Errorf("backend connections %d, want %d", n, len(tc.ips))
			}
			got := series(t, s)
			for name, want := range map[string]float64{
				`sluice_frontend_backend_proxy_connections{protocol=sip}`:                      2,
				`sluice_frontend_events_total{event=backend_proxy_conns_refused,protocol=sip}`: 1,
			} {
				if v, ok := got[name]; !ok || v != want {
					t.Errorf("%s = %v (exported %v), want %v", name, v, ok, want)
				}
			}
		})
	}
}

// TestProxyBackendSpec: proxy=v1|v2 on a TCP backend is taken; on UDP it
// is refused naming what is wanted.
func TestProxyBackendSpec(t *testing.T) {
	for _, tc := range []struct {
		spec  string
		proxy uint8
		err   string
	}{
		{"127.0.0.1:5060,transport=tcp,proxy=v2", 2, ""},
		{"127.0.0.1:5060,transport=tcp,proxy=v1", 1, ""},
		{"127.0.0.1:5060,transport=tcp,proxy=off", 0, ""},
		{"127.0.0.1:5060,proxy=v2", 0, "proxy needs transport=tcp"},
		{"127.0.0.1:5060,transport=tcp,proxy=v3", 0, "proxy must be v1, v2 or off"},
	} {
		b, err := ParseBackend(tc.spec)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: err %v, want %q", tc.spec, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.spec, err)
		case tc.err == "" && b.Proxy != tc.proxy:
			t.Errorf("%s: proxy %d, want %d", tc.spec, b.Proxy, tc.proxy)
		}
	}
	if _, _, err := checkBackends([]BackendConfig{{Addr: "127.0.0.1:5060", Proxy: 2}}); err == nil || !strings.Contains(err.Error(), "proxy needs transport tcp or tls") {
		t.Errorf("UDP backend with proxy: err %v", err)
	}
}

// TestProxyProtocolOutSIPReload: proxy=v2 set on reload for a backend at
// the same address closes the connection opened without a header; the
// next one starts with a LOCAL header, and a client's call gets its own.
func TestProxyProtocolOutSIPReload(t *testing.T) {
	be := newProxyUAS(t, true)
	cfg := BackendConfig{ID: "k1", Addr: be.addr, Transport: "tcp", Weight: 1}
	s := testServer(t, nil, nil, func(c *Config) { c.Backends = []BackendConfig{cfg} })
	eventually(t, "the plain connection", func() bool { return s.tcp.len() == 1 })
	cfg.Proxy = 2
	if err := s.SetBackends([]BackendConfig{cfg}, nil); err != nil {
		t.Fatal(err)
	}
	c := newUACAt(t, s.udpAddr(), "127.0.0.2")
	k := c.newCall()
	k.invite("")
	c.recvResponse(180)
	c.recvResponse(200)
	eventually(t, "the shared connection again, with its header", func() bool { return be.conns() == 2 })
	var sawLocal, sawClient bool
	for i := range 2 {
		h := be.header(i)
		sawLocal = sawLocal || h.Command == proxyproto.Local
		sawClient = sawClient || h.Source == c.addr
	}
	eventually(t, "the connection without a header closed", func() bool { be.mu.Lock(); defer be.mu.Unlock(); return be.plain == 1 })
	if !sawLocal || !sawClient {
		t.Errorf("headers %+v, %+v: want one LOCAL, one naming %s", be.header(0), be.header(1), c.addr)
	}
}

// TestProxyProtocolOutKamailio: Kamailio with tcp_accept_haproxy=yes
// behind sluice (proxy=v1, proxy=v2) takes each client's request as from
// that client ($si:$sp, sent back in X-Src), and its answers reach the
// right client. Kamailio before the fix of kamailio/kamailio#3683 (5.6
// is one) reads a v2 header's ports byte-swapped: with v2 the address
// must be the client's and the port the client's either way.
func TestProxyProtocolOutKamailio(t *testing.T) {
	for _, v := range []uint8{1, 2} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) { testKamailioProxyOut(t, v) })
	}
}

func testKamailioProxyOut(t *testing.T, v uint8) {
	bin := testenv.Tool(t, "kamailio", "kamailio")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	cfg, err := os.ReadFile(filepath.Join("testdata", "kamailio-haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "kamailio.cfg")
	if err := os.WriteFile(file, bytes.ReplaceAll(cfg, []byte("listen=LISTEN"), []byte("listen=tcp:"+addr.String())), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-DD", "-E", "-f", file, "-Y", dir, "-P", filepath.Join(dir, "kamailio.pid"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t.Cleanup(func() { // after startGroup's: Kamailio has stopped
		if t.Failed() {
			t.Logf("kamailio output:\n%s", tail(out.Bytes(), 6000))
		}
	})
	exited := startGroup(t, cmd)
	eventually(t, "kamailio listening", func() bool {
		select {
		case <-exited:
			t.Fatalf("kamailio exited:\n%s", tail(out.Bytes(), 6000))
		default:
		}
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	s := testServer(t, nil, nil, func(c *Config) {
		c.Backends = []BackendConfig{{ID: "kam", Addr: addr.String(), Transport: "tcp", Weight: 1, Proxy: v}}
	})
	for _, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		c := newUACAt(t, s.udpAddr(), ip)
		k := c.newCall()
		c.send(fmt.Sprintf("MESSAGE sip:svc@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=m\r\nTo: <sip:svc@test>\r\nCall-ID: %s\r\nCSeq: 1 MESSAGE\r\nContent-Length: 0\r\n\r\n",
			s.udpAddr(), c.addr, k.branch, k.callID))
		res := c.recvResponse(200)
		h := res.GetHeader("X-Src")
		if h == nil {
			t.Fatalf("client %s: no X-Src in %v", c.addr, res)
		}
		want := c.addr.String()
		swapped := netip.AddrPortFrom(c.addr.Addr(), c.addr.Port()<<8|c.addr.Port()>>8).String()
		switch got := h.Value(); {
		case got == want:
		case v == 2 && got == swapped:
			t.Logf("client %s: Kamailio read the v2 port byte-swapped (%s; kamailio/kamailio#3683)", want, got)
		default:
			t.Errorf("client %s: Kamailio took the request from %s", want, got)
		}
	}
	if n := s.proxied.len(); n != 2 {
		t.Errorf("per-client connections %d, want 2", n)
	}
}
