package http

import (
	"net"
	"net/netip"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/proxyproto"
)

// The PROXY protocol on the way out (-http-backend ADDR,proxy=v1|v2). A
// connection to such a backend starts with a header naming the client
// whose request opened it, and it carries only that client connection's
// requests: a backend (nginx proxy_protocol, HAProxy accept-proxy) reads
// the header once per connection and takes every request on it as that
// client's, so a connection shared between clients would give later
// requests the first client's address. This is HAProxy's "private"
// connection: on the loop engine a client connection keeps the backend
// connection it opened for its next requests to that backend (keep-alive
// is kept per client), closed with it or when it moves to another
// backend; it is never given to another client. On the fasthttp engine
// (connections the loop hands over, or -http-engine fasthttp) each request
// to such a backend gets a connection of its own, closed after the answer.
//
// The header names the client's address and port (the ones a PROXY
// header coming in named, else the socket's) and, as destination, the
// address the client connected to.

// proxyHeader appends the header of version v for a connection from
// client (ip, port) whose local socket address is local.
func proxyHeader(b []byte, v uint8, ip netip.Addr, port uint16, local netip.AddrPort) []byte {
	return proxyproto.Append(b, v, netip.AddrPortFrom(ip, port), local)
}

// exchangeProxied sends ctx's request to b over a connection of its own
// that starts with b's PROXY header for ctx's client, and closes it after
// the answer.
func (s *Server) exchangeProxied(ctx *fasthttp.RequestCtx, b *lb.Backend) error {
	hdr := proxyHeaderOf(ctx, b)
	hc := s.newClient(b.Addr(), s.cfg.ResponseBuffer, b.TLS())
	hc.MaxConns = 1
	hc.MaxIdemponentCallAttempts = 1
	hc.RetryIfErr = nil
	hc.Dial = func(addr string) (net.Conn, error) { return s.dialWith(addr, b.TLS(), hdr) }
	was := ctx.Request.Header.ConnectionClose()
	ctx.Request.SetConnectionClose()
	err := hc.Do(&ctx.Request, &ctx.Response)
	if !was {
		ctx.Request.Header.ResetConnectionClose()
	}
	return err
}

// proxyHeaderOf returns the PROXY header a connection to b opened for
// ctx's request starts with; nil when b takes none.
func proxyHeaderOf(ctx *fasthttp.RequestCtx, b *lb.Backend) []byte {
	v := b.Proxy()
	if v == 0 {
		return nil
	}
	src, dst := addrPortOf(ctx.RemoteAddr()), addrPortOf(ctx.LocalAddr())
	return proxyproto.Append(nil, v, netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()))
}

// addrPortOf returns a's address and port, zero when a is not TCP.
func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	return netip.AddrPort{}
}
