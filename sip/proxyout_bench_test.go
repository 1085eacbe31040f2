package sip

import (
	"io"
	"net"
	"net/netip"
	"testing"

	"github.com/sluicelb/sluice/proxyproto"
)

// BenchmarkSendProxied measures a send to a proxy=v2 backend over the
// client's connection once it is open: the backend lookup, the per-client
// table and the write, against BenchmarkSendShared, the same message over
// the backend's shared connection.
func BenchmarkSendProxied(b *testing.B) { benchSend(b, true) }

// BenchmarkSendShared is BenchmarkSendProxied without a client named.
func BenchmarkSendShared(b *testing.B) { benchSend(b, false) }

func benchSend(b *testing.B, proxied bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := proxyproto.Read(c, nil); err == nil {
					_, _ = io.Copy(io.Discard, c)
				}
			}()
		}
	}()
	s := testServer(b, nil, nil, func(c *Config) {
		c.Backends = []BackendConfig{{ID: "k1", Addr: ln.Addr().String(), Transport: "tcp", Weight: 1, Proxy: 2}}
		c.HealthInterval = 0
	})
	be := s.pool.Load().byID["k1"]
	client := netip.MustParseAddrPort("127.0.0.2:5060")
	dst := target{addr: be.addr, tcp: true}
	if proxied {
		dst.client = client
	}
	msg := []byte("MESSAGE sip:svc@test SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:5060;branch=z9hG4bK-b\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=a\r\nTo: <sip:b@test>\r\nCall-ID: bench@test\r\nCSeq: 1 MESSAGE\r\nContent-Length: 0\r\n\r\n")
	eventually(b, "the connection", func() bool {
		_ = s.sendBytes(msg, dst)
		if proxied {
			s.proxied.mu.Lock()
			defer s.proxied.mu.Unlock()
			return s.proxied.conns[proxyKey{be.addr, client}] != nil
		}
		return s.tcp.get(be.addr) != nil
	})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := s.sendBytes(msg, dst); err != nil {
			b.Fatal(err)
		}
	}
}
