package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeTestCert writes a self-signed ECDSA certificate for name with its
// key in one PEM and returns the path.
func writeTestCert(t *testing.T, dir, name string) string {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(42), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(k)
	p := filepath.Join(dir, name+".pem")
	data := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})...)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunTLSFlags: a certificate that cannot serve, or a bad handshake
// setting, stops start-up naming the flag; a good one is listed in
// /status.
func TestRunTLSFlags(t *testing.T) {
	dir := t.TempDir()
	base := []string{"-http-backend", "127.0.0.1:1", "-http-listen", "127.0.0.1:0", "-data-dir", dir, "-health-interval", "0"}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-tls-cert", filepath.Join(dir, "missing.pem"), "-admin-listen", ""}, []string{"-tls-cert", "missing.pem"}},
		{[]string{"-tls-cert", "a.pem,key=", "-admin-listen", ""}, []string{"-tls-cert", "key= without a file"}},
		{[]string{"-tls-handshake-timeout", "0s", "-admin-listen", ""}, []string{"-tls-handshake-timeout", "must be positive"}},
		{[]string{"-tls-handshakes-max", "-1", "-admin-listen", ""}, []string{"-tls-handshakes-max", "must not be negative"}},
	} {
		var stderr syncBuffer
		code := run(context.Background(), append(append([]string{}, base...), tc.args...), io.Discard, &stderr, nil)
		for _, w := range tc.want {
			if code != 2 || !strings.Contains(stderr.String(), w) {
				t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr.String(), w)
			}
		}
	}

	cert := writeTestCert(t, dir, "www.example.com")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan net.Addr, 1)
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		done <- run(ctx, append(base, "-tls-cert", cert, "-admin-listen", "127.0.0.1:0"), io.Discard, &stderr, &runHooks{ready: func(_, a net.Addr) { ready <- a }})
	}()
	var admin net.Addr
	select {
	case admin = <-ready:
	case code := <-done:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	_, _, body := httpGet(t, "http://"+admin.String()+"/status")
	var st struct {
		TLS []struct {
			File  string   `json:"file"`
			Names []string `json:"names"`
		} `json:"tls_certificates"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil || len(st.TLS) != 1 || st.TLS[0].File != cert || st.TLS[0].Names[0] != "www.example.com" {
		t.Errorf("/status tls_certificates: %+v (%v)", st.TLS, err)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
}
