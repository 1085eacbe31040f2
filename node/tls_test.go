package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/tlsedge"
)

// selfSigned writes a PEM of a self-signed ECDSA certificate for names
// and its key (HAProxy's crt) and returns its path.
func selfSigned(t *testing.T, dir, file string, serial int64, names ...string) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(30 * 24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalPKCS8PrivateKey(k)
	data := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd})...)
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p+".tmp", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		t.Fatal(err)
	}
	return p
}

// tlsNode is a node with -tls-cert file and the admin listener.
func tlsNode(t *testing.T, keyFile string, certs ...string) *Node {
	t.Helper()
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"127.0.0.1:1"}
	cfg.AdminListen = "127.0.0.1:0"
	cfg.KeyFile = keyFile
	cfg.TLS = tlsedge.DefaultConfig()
	cfg.TLS.Certs = certs
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestTLSWiring(t *testing.T) {
	dir := t.TempDir()
	cert := selfSigned(t, dir, "site.pem", 10, "www.example.com")
	n := tlsNode(t, "", cert)
	if n.TLS() == nil || n.Handshakes() == nil || n.HandshakeTimeout() != 10*time.Second {
		t.Fatalf("store %v limiter %v timeout %v", n.TLS(), n.Handshakes(), n.HandshakeTimeout())
	}
	if c := n.tlsConfig("h2", "http/1.1"); c == nil || c.MinVersion != tls.VersionTLS12 || len(c.NextProtos) != 2 {
		t.Fatalf("tlsConfig: %+v", c)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	admin := "http://" + n.Addrs().Admin.String()
	get := func(path string) string {
		resp, err := http.Get(admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	var st struct {
		TLS []tlsedge.CertInfo `json:"tls_certificates"`
	}
	if err := json.Unmarshal([]byte(get("/status")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.TLS) != 1 || st.TLS[0].File != cert || st.TLS[0].Names[0] != "www.example.com" || st.TLS[0].Serial != "A" || st.TLS[0].SecondsToExpiry < 29*24*3600 {
		t.Fatalf("/status tls_certificates: %+v", st.TLS)
	}
	metrics := get("/metrics")
	for _, want := range []string{
		`sluice_tls_certificate_expiry_seconds{file="` + cert + `",name="www.example.com"}`,
		`sluice_tls_certificate_reloads_total{result="failed"} 0`,
		`sluice_tls_handshakes_in_flight 0`,
		`sluice_tls_handshakes_refused_total{reason="rate"} 0`,
		`sluice_tls_handshakes_refused_total{reason="source"} 0`,
		`sluice_tls_handshakes_refused_total{reason="in_flight"} 0`,
		`reason: in_flight (-tls-handshakes-max under way), source (`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// A bad new file is refused, the old one serves on, /status says why.
	os.WriteFile(cert, []byte("not a certificate\n"), 0o600)
	err := n.ReloadTLS()
	if err == nil || !strings.Contains(err.Error(), cert) {
		t.Fatalf("ReloadTLS of a bad file: %v", err)
	}
	if lr := n.lastReload(); lr == nil || lr.OK || !strings.Contains(lr.Error, cert) {
		t.Errorf("last reload %+v", lr)
	}
	if !strings.Contains(get("/metrics"), `sluice_tls_certificate_reloads_total{result="failed"} 1`) {
		t.Error("failed reload not counted")
	}
	c, _ := n.TLS().GetCertificate(&tls.ClientHelloInfo{ServerName: "www.example.com"})
	if c.Leaf.SerialNumber.Int64() != 10 {
		t.Errorf("serving serial %v after a refused reload", c.Leaf.SerialNumber)
	}
	selfSigned(t, dir, "site.pem", 11, "www.example.com")
	if err := n.ReloadTLS(); err != nil {
		t.Fatal(err)
	}
	c, _ = n.TLS().GetCertificate(&tls.ClientHelloInfo{ServerName: "www.example.com"})
	if c.Leaf.SerialNumber.Int64() != 11 {
		t.Errorf("serving serial %v after a good reload", c.Leaf.SerialNumber)
	}
}

func TestTLSRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "missing.pem")
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"127.0.0.1:1"}
	cfg.TLS = tlsedge.DefaultConfig()
	cfg.TLS.Certs = []string{bad}
	_, err := New(cfg, nil)
	var fe *admission.FieldError
	if !errors.As(err, &fe) || fe.Field != "Certs" || !strings.Contains(err.Error(), bad) {
		t.Fatalf("New with a missing certificate: %v; want a FieldError of Certs naming the file", err)
	}
	cfg.TLS.Certs = nil
	cfg.TLS.HandshakeTimeout = 0
	if _, err := New(cfg, nil); !errors.As(err, &fe) || fe.Field != "HandshakeTimeout" {
		t.Fatalf("zero handshake timeout: %v", err)
	}
	if err := cfg.needTLS("-https-listen"); err == nil || !strings.Contains(err.Error(), "-https-listen") || !strings.Contains(err.Error(), "-tls-cert") {
		t.Fatalf("needTLS: %v; want both flags named", err)
	}
	// A node without TLS settings (built in code) gets the defaults.
	n, err := New(func() Config { c := testConfig(t); c.HTTPBackends = []string{"127.0.0.1:1"}; return c }(), nil)
	if err != nil || n.TLS() != nil || n.HandshakeTimeout() != tlsedge.DefaultHandshakeTimeout || n.tlsConfig() != nil {
		t.Fatalf("no TLS: %v, store %v", err, n.TLS())
	}
}

// TestTLSResumesAcrossNodes: two nodes with the same -affinity-key-file
// seal session tickets with the same keys: a client resumes on the other
// node; a node with another key makes it a full handshake.
func TestTLSResumesAcrossNodes(t *testing.T) {
	dir := t.TempDir()
	cert := selfSigned(t, dir, "site.pem", 1, "www.example.com")
	key := filepath.Join(dir, "affinity.key")
	a := tlsNode(t, key, cert)
	b := tlsNode(t, key, cert)
	other := tlsNode(t, filepath.Join(dir, "other.key"), cert)
	cli := &tls.Config{InsecureSkipVerify: true, ServerName: "www.example.com", ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	if cs := handshakeWith(t, a.tlsConfig(), cli); cs.DidResume {
		t.Fatal("first handshake resumed")
	}
	if cs := handshakeWith(t, b.tlsConfig(), cli); !cs.DidResume {
		t.Error("no resumption on a node sharing the key ring")
	}
	if cs := handshakeWith(t, other.tlsConfig(), cli); cs.DidResume {
		t.Error("resumed on a node with another key")
	}
}

// handshakeWith runs a handshake over loopback TCP; the server writes a
// byte after it so that a TLS 1.3 client takes its ticket.
func handshakeWith(t *testing.T, srv, cli *tls.Config) tls.ConnectionState {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute)) // a safety net, not a criterion
		s := tls.Server(c, srv)
		if s.Handshake() == nil {
			s.Write([]byte{1})
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), cli)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	return c.ConnectionState()
}

// TestTLSCertWithoutListenerWarns: certificates with no TLS listener to
// serve them are most likely a forgotten -https-listen: start-up says so.
func TestTLSCertWithoutListenerWarns(t *testing.T) {
	cert := selfSigned(t, t.TempDir(), "site.pem", 10, "www.example.com")
	for _, tc := range []struct {
		name     string
		https    string
		wantWarn bool
	}{
		{"no listener", "", true},
		{"https listener", "127.0.0.1:0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.HTTPBackends = []string{"127.0.0.1:1"}
			cfg.HTTP.TLSListen = tc.https
			cfg.TLS = tlsedge.DefaultConfig()
			cfg.TLS.Certs = []string{cert}
			var logs strings.Builder
			n, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			_ = n
			if got := strings.Contains(logs.String(), "no TLS listener"); got != tc.wantWarn {
				t.Errorf("warning %v, want %v; logs %q", got, tc.wantWarn, logs.String())
			}
		})
	}
}
