package tlsedge

import (
	"crypto/tls"
	"net"
	"runtime"
	"testing"
	"time"
)

// BenchmarkHandshake measures one handshake over an in-memory pipe: ns/op
// and allocs are client and server together; server-ns/op is the CPU time
// of the server side alone (its goroutine runs locked to one OS thread,
// whose CPU clock is read), the figure that matters for the balancer.
// Full handshakes with an ECDSA P-256 and an RSA 2048 certificate, in
// TLS 1.3 and 1.2, and resumed ones (session tickets).
func BenchmarkHandshake(b *testing.B) {
	dir := b.TempDir()
	rk := testKey(b, "rsa", 0)
	files := map[string]string{
		"ECDSA-P256": combined(b, dir, "ec.pem", certOpts{dns: []string{"www.example.com"}}),
		"RSA-2048":   writeFile(b, dir, "rsa.pem", append(certPEM(makeCert(b, certOpts{dns: []string{"www.example.com"}, key: rk})), keyPEM(b, rk, "pkcs1")...)),
	}
	for _, tc := range []struct {
		cert    string
		version uint16
		x25519  bool // the client offers X25519 only, not the default hybrid X25519MLKEM768 first
		resume  bool
	}{
		{"ECDSA-P256", tls.VersionTLS13, false, false},
		{"RSA-2048", tls.VersionTLS13, false, false},
		{"ECDSA-P256", tls.VersionTLS13, true, false},
		{"RSA-2048", tls.VersionTLS13, true, false},
		{"ECDSA-P256", tls.VersionTLS12, false, false},
		{"RSA-2048", tls.VersionTLS12, false, false},
		{"ECDSA-P256", tls.VersionTLS13, false, true},
		{"ECDSA-P256", tls.VersionTLS12, false, true},
	} {
		name := tc.cert + "/TLS1.3"
		if tc.version == tls.VersionTLS12 {
			name = tc.cert + "/TLS1.2"
		}
		if tc.x25519 {
			name += "-X25519"
		}
		if tc.resume {
			name += "/resumed"
		} else {
			name += "/full"
		}
		b.Run(name, func(b *testing.B) {
			s, err := New(Config{Certs: []string{files[tc.cert]}, HandshakeTimeout: time.Second}, Deps{})
			if err != nil {
				b.Fatal(err)
			}
			cli := clientFor("www.example.com")
			cli.MinVersion, cli.MaxVersion = tc.version, tc.version
			if tc.x25519 {
				cli.CurvePreferences = []tls.CurveID{tls.X25519}
			}
			if tc.resume {
				cli.ClientSessionCache = tls.NewLRUClientSessionCache(8)
			}
			benchHandshake(b, s.ServerConfig("http/1.1"), cli, tc.resume)
		})
	}
}

func benchHandshake(b *testing.B, srv, cli *tls.Config, resume bool) {
	conns := make(chan net.Conn)
	cpu := make(chan int64)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		start := threadCPU()
		for c := range conns {
			if c == nil { // the measurement starts now
				start = threadCPU()
				continue
			}
			s := tls.Server(c, srv)
			if err := s.Handshake(); err == nil {
				s.Write([]byte{'x'})
			}
			c.Close()
		}
		cpu <- threadCPU() - start
	}()
	one := func() tls.ConnectionState {
		a, c := net.Pipe()
		conns <- a
		cc := tls.Client(c, cli)
		var buf [1]byte
		if err := cc.Handshake(); err != nil {
			b.Fatal(err)
		}
		if _, err := cc.Read(buf[:]); err != nil { // takes a TLS 1.3 ticket
			b.Fatal(err)
		}
		c.Close()
		return cc.ConnectionState()
	}
	if resume {
		one() // a session to resume
	}
	conns <- nil
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if cs := one(); cs.DidResume != resume {
			b.Fatalf("resumed %v; want %v", cs.DidResume, resume)
		}
	}
	b.StopTimer()
	close(conns)
	if ns := <-cpu; ns >= 0 {
		b.ReportMetric(float64(ns)/float64(b.N), "server-ns/op")
	}
}

// BenchmarkGetCertificate is the SNI choice alone, among 100 names.
func BenchmarkGetCertificate(b *testing.B) {
	dir := b.TempDir()
	var certs []string
	for i := range 100 {
		certs = append(certs, combined(b, dir, "c"+string(rune('a'+i%26))+string(rune('a'+i/26))+".pem", certOpts{dns: []string{"h" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + ".example.com"}}))
	}
	certs = append(certs, combined(b, dir, "wild.pem", certOpts{dns: []string{"*.example.org"}}))
	s, err := New(Config{Certs: certs, HandshakeTimeout: time.Second}, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"hzc.example.com", "shop.example.org", "WWW.Wrong.Test."} {
		b.Run(name, func(b *testing.B) {
			hello := &tls.ClientHelloInfo{ServerName: name}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.GetCertificate(hello); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
