package tlsedge

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
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

	"github.com/sluicelb/sluice/admission"
)

// testCA is the issuer of the tests' certificates; clients trust it.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

var (
	caOnce sync.Once
	ca     testCA
	// keys are generated once per type: RSA generation is slow.
	keyMu    sync.Mutex
	keyCache = map[string][]crypto.Signer{}
)

func theCA(t testing.TB) testCA {
	caOnce.Do(func() {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(10 * 365 * 24 * time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
		if err != nil {
			panic(err)
		}
		c, _ := x509.ParseCertificate(der)
		ca = testCA{cert: c, key: k, pool: x509.NewCertPool()}
		ca.pool.AddCert(c)
	})
	return ca
}

// testKey returns the i-th cached key of kind "ecdsa", "rsa" (2048) or
// "rsa1024".
func testKey(t testing.TB, kind string, i int) crypto.Signer {
	keyMu.Lock()
	defer keyMu.Unlock()
	for len(keyCache[kind]) <= i {
		var k crypto.Signer
		var err error
		switch kind {
		case "ecdsa":
			k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		case "rsa":
			k, err = rsa.GenerateKey(rand.Reader, 2048)
		case "rsa1024":
			k, err = rsa.GenerateKey(rand.Reader, 1024)
		}
		if err != nil {
			t.Fatal(err)
		}
		keyCache[kind] = append(keyCache[kind], k)
	}
	return keyCache[kind][i]
}

// certOpts describe a test certificate.
type certOpts struct {
	dns       []string
	ips       []net.IP
	cn        string
	key       crypto.Signer // nil: the first ECDSA key
	serial    int64
	notBefore time.Time // zero: an hour ago
	notAfter  time.Time // zero: in 90 days
	eku       []x509.ExtKeyUsage
	selfSign  bool
}

var serialSeq struct {
	sync.Mutex
	n int64
}

// makeCert returns the DER of a leaf issued by the test CA.
func makeCert(t testing.TB, o certOpts) []byte {
	t.Helper()
	c := theCA(t)
	if o.key == nil {
		o.key = testKey(t, "ecdsa", 0)
	}
	if o.serial == 0 {
		serialSeq.Lock()
		serialSeq.n++
		o.serial = 1000 + serialSeq.n
		serialSeq.Unlock()
	}
	if o.notBefore.IsZero() {
		o.notBefore = time.Now().Add(-time.Hour)
	}
	if o.notAfter.IsZero() {
		o.notAfter = time.Now().Add(90 * 24 * time.Hour)
	}
	if o.eku == nil {
		o.eku = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(o.serial), Subject: pkix.Name{CommonName: o.cn},
		DNSNames: o.dns, IPAddresses: o.ips, NotBefore: o.notBefore, NotAfter: o.notAfter,
		ExtKeyUsage: o.eku, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	parent, signer := c.cert, c.key
	if o.selfSign {
		parent, signer = tmpl, o.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, o.key.Public(), signer)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func certPEM(ders ...[]byte) []byte {
	var out []byte
	for _, d := range ders {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d})...)
	}
	return out
}

// keyPEM encodes k as "pkcs8", "pkcs1" (RSA) or "sec1" (ECDSA).
func keyPEM(t testing.TB, k crypto.Signer, format string) []byte {
	t.Helper()
	var b *pem.Block
	switch format {
	case "pkcs8":
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		b = &pem.Block{Type: "PRIVATE KEY", Bytes: der}
	case "pkcs1":
		b = &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k.(*rsa.PrivateKey))}
	case "sec1":
		der, err := x509.MarshalECPrivateKey(k.(*ecdsa.PrivateKey))
		if err != nil {
			t.Fatal(err)
		}
		b = &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}
	}
	return pem.EncodeToMemory(b)
}

func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// replaceFile writes data to a new file and renames it over p, as
// certbot and operators replace certificates.
func replaceFile(t testing.TB, p string, data []byte) {
	t.Helper()
	tmp := p + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

// combined writes a PEM of the leaf then its key (HAProxy's crt) and
// returns its path.
func combined(t testing.TB, dir, name string, o certOpts) string {
	t.Helper()
	if o.key == nil {
		o.key = testKey(t, "ecdsa", 0)
	}
	return writeFile(t, dir, name, append(certPEM(makeCert(t, o)), keyPEM(t, o.key, "pkcs8")...))
}

// wallClock is an injected wall clock.
type wallClock struct {
	mu sync.Mutex
	t  time.Time
}

func newWallClock() *wallClock { return &wallClock{t: time.Now()} }

func (c *wallClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *wallClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *wallClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// events records a Store's events.
type events struct {
	mu  sync.Mutex
	evs []admission.Event
}

func (e *events) sink(ev admission.Event) {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
}

func (e *events) kinds() []admission.EventKind {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []admission.EventKind
	for _, ev := range e.evs {
		out = append(out, ev.Kind)
	}
	return out
}

func (e *events) count(kind admission.EventKind) int {
	n := 0
	for _, k := range e.kinds() {
		if k == kind {
			n++
		}
	}
	return n
}

// tcpPair is a connected pair of loopback TCP connections: unlike
// net.Pipe they buffer, so an alert written by one side while the other
// writes too does not deadlock.
func tcpPair(t testing.TB) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	// A safety net against a hung test, never a pass/fail criterion.
	deadline := time.Now().Add(time.Minute)
	r.c.SetDeadline(deadline)
	client.SetDeadline(deadline)
	return r.c, client
}

// handshake runs a TLS handshake over loopback TCP between srv and cli
// and returns the client's view. The server writes one byte after the
// handshake, which the client reads: a TLS 1.3 client takes its session
// ticket then.
func handshake(t testing.TB, srv, cli *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	a, b := tcpPair(t)
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	go func() {
		s := tls.Server(a, srv)
		err := s.Handshake()
		if err == nil {
			_, err = s.Write([]byte{'x'})
		}
		done <- err
	}()
	c := tls.Client(b, cli)
	err := c.Handshake()
	if err == nil {
		var buf [1]byte
		_, err = c.Read(buf[:])
	}
	b.Close()
	serr := <-done
	if err == nil {
		err = serr
	}
	return c.ConnectionState(), err
}

// clientFor is a client config trusting the test CA, for name.
func clientFor(name string) *tls.Config {
	return &tls.Config{RootCAs: theCA(nil).pool, ServerName: name}
}
