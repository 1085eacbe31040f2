package sip

import (
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSipsReachesTLSBackend: a sips: request from a client over TLS may
// go on to a TLS backend, TLS on every hop (RFC 5630): the 480 "not
// forwarded over UDP or TCP" is for backends that are not TLS.
func TestSipsReachesTLSBackend(t *testing.T) {
	srv, _ := testTLS(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificates[0].Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	be := newTCPUASOn(t, ln)
	s, cli := edgeServer(t, nil, func(c *Config) {
		c.Backends = []BackendConfig{{ID: "tls1", Addr: be.addr, Transport: "tls", CAFile: ca, SNI: "sip.test", Weight: 1}}
	})
	eventually(t, "connection to the backend", func() bool { return s.tcp.len() >= 1 })
	c := dialTLS(t, s, cli)
	la := c.conn.LocalAddr().String()
	c.write(fmt.Sprintf("INVITE sips:svc@test SIP/2.0\nVia: SIP/2.0/TLS %s;branch=z9hG4bK-sips-tls\nMax-Forwards: 70\nFrom: <sips:a@test>;tag=ta\nTo: <sips:svc@test>\nCall-ID: sips-tls@test\nCSeq: 1 INVITE\nContact: <sips:a@%s>\nContent-Length: 0\n\n", la, la))
	select {
	case m := <-be.got:
		if m != "INVITE" {
			t.Fatalf("backend got %s", m)
		}
	case <-time.After(wait):
		t.Fatalf("a sips: INVITE over TLS did not reach the TLS backend (sips_refused %d)", s.metrics.SipsRefused.Load())
	}
}
