package node

import (
	"context"
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
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/tlsedge"
)

// writeTestCert writes a self-signed certificate for 127.0.0.1 and its key
// as PEM files in dir.
func writeTestCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sip.test"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestSIPEdgeListeners: a node with -sip-tls-listen, -sip-ws-listen and
// -sip-wss-listen serves the certificate of -tls-cert (the store HTTPS
// uses) on TLS and WSS, chosen by SNI; without a certificate the TLS
// listeners are refused, naming the flags; a bad certificate file stops
// start-up naming it.
func TestSIPEdgeListeners(t *testing.T) {
	certFile, keyFile := writeTestCert(t, t.TempDir())
	cfg := testConfig(t)
	cfg.SIPBackends = []string{"127.0.0.1:1,id=s1"}
	cfg.SIP.TLSListen, cfg.SIP.WSListen, cfg.SIP.WSSListen = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.TLS = tlsedge.DefaultConfig()
	cfg.TLS.Certs = []string{certFile + ",key=" + keyFile}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	a := n.Addrs()
	if a.SIPTLS == nil || a.SIPWS == nil || a.SIPWSS == nil {
		t.Fatalf("edge addresses %+v", a)
	}
	for _, addr := range []net.Addr{a.SIPTLS, a.SIPWSS} {
		c, err := tls.Dial("tcp", addr.String(), &tls.Config{InsecureSkipVerify: true, ServerName: "sip.test"})
		if err != nil {
			t.Fatalf("TLS handshake with %s: %v", addr, err)
		}
		if cn := c.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "sip.test" {
			t.Errorf("served certificate %q, want the one of -tls-cert", cn)
		}
		c.Close()
	}

	for _, tc := range []struct {
		name       string
		cert, key  string
		wantInText string
	}{
		{"no-cert", "", "", "-tls-cert"},
		{"missing-file", filepath.Join(t.TempDir(), "none.pem"), keyFile, "none.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.SIPBackends = []string{"127.0.0.1:1,id=s1"}
			cfg.SIP.TLSListen = "127.0.0.1:0"
			if tc.cert != "" {
				cfg.TLS = tlsedge.DefaultConfig()
				cfg.TLS.Certs = []string{tc.cert + ",key=" + tc.key}
			}
			if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), tc.wantInText) {
				t.Errorf("error %v, want one naming %s", err, tc.wantInText)
			}
		})
	}
}
