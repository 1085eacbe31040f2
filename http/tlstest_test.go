package http

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// testPKI is the tests' certificates, made when first needed: a CA and
// two server certificates signed by it, for a.example (and 127.0.0.1)
// and b.example, ECDSA P-256.
type testPKI struct {
	ca     *x509.Certificate
	caPEM  []byte
	a, b   tls.Certificate
	roots  *x509.CertPool
	leafOf map[string]*x509.Certificate // by the name it is for
}

var (
	pkiOnce sync.Once
	pki     *testPKI
	pkiErr  error
)

// testTLS returns the tests' certificates.
func testTLS(t testing.TB) *testPKI {
	t.Helper()
	pkiOnce.Do(func() { pki, pkiErr = newTestPKI() })
	if pkiErr != nil {
		t.Fatal(pkiErr)
	}
	return pki
}

func newTestPKI() (*testPKI, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p := &testPKI{ca: ca, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), roots: x509.NewCertPool(), leafOf: map[string]*x509.Certificate{}}
	p.roots.AddCert(ca)
	leaf := func(serial int64, name string, ips ...net.IP) (tls.Certificate, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			DNSNames:     []string{name},
			IPAddresses:  ips,
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return tls.Certificate{}, err
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return tls.Certificate{}, err
		}
		p.leafOf[name] = c
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: c}, nil
	}
	if p.a, err = leaf(2, "a.example", net.IPv4(127, 0, 0, 1)); err != nil {
		return nil, err
	}
	if p.b, err = leaf(3, "b.example"); err != nil {
		return nil, err
	}
	return p, nil
}

// server returns a server configuration with both certificates: chosen
// by SNI, a.example's for any other name (the first).
func (p *testPKI) server() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.a, p.b}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
}

// client returns a client configuration that trusts the test CA and asks
// for sni.
func (p *testPKI) client(sni string) *tls.Config {
	return &tls.Config{RootCAs: p.roots, ServerName: sni, NextProtos: []string{"http/1.1"}}
}

// caFile writes the CA certificate to a file of t's and returns its path.
func (p *testPKI) caFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, p.caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsClients maps the address of a rig serving HTTPS to the client
// configuration that trusts it: dialTest dials it with TLS.
var tlsClients sync.Map

// dialTest dials addr, with TLS when a rig serves HTTPS there
// (tlsClients), within d.
func dialTest(addr string, d time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return nil, err
	}
	v, ok := tlsClients.Load(addr)
	if !ok {
		return c, nil
	}
	tc := tls.Client(c, v.(*tls.Config))
	tc.SetDeadline(time.Now().Add(d))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	tc.SetDeadline(time.Time{})
	return tc, nil
}
