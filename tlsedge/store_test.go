package tlsedge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// sniStore is three certificates: a default, an exact name and a wildcard.
func sniStore(t *testing.T) (*Store, map[string]string) {
	dir := t.TempDir()
	files := map[string]string{
		"default":  combined(t, dir, "default.pem", certOpts{dns: []string{"default.example"}}),
		"www":      combined(t, dir, "www.pem", certOpts{dns: []string{"www.example.com", "api.example.com"}}),
		"wildcard": combined(t, dir, "wild.pem", certOpts{dns: []string{"*.example.com"}}),
		"ip":       combined(t, dir, "ip.pem", certOpts{ips: []net.IP{net.ParseIP("192.0.2.9")}}),
	}
	s, err := New(Config{Certs: []string{files["default"], files["www"], files["wildcard"], files["ip"]}, HandshakeTimeout: time.Second}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return s, files
}

// fakeConn is a net.Conn with a local address, for GetCertificate.
type fakeConn struct {
	net.Conn
	local net.Addr
}

func (c fakeConn) LocalAddr() net.Addr { return c.local }

func TestSNISelection(t *testing.T) {
	s, files := sniStore(t)
	byFile := map[string]string{}
	for k, f := range files {
		byFile[f] = k
	}
	ip := func(s string) net.Conn { return fakeConn{local: &net.TCPAddr{IP: net.ParseIP(s), Port: 443}} }
	for _, tc := range []struct {
		sni  string
		conn net.Conn
		want string
	}{
		{"www.example.com", nil, "www"},             // exact
		{"api.example.com", nil, "www"},             // exact, second name
		{"WWW.Example.Com.", nil, "www"},            // case and trailing dot ignored
		{"shop.example.com", nil, "wildcard"},       // wildcard, one label
		{"SHOP.example.com.", nil, "wildcard"},      // wildcard, case and dot
		{"a.b.example.com", nil, "default"},         // wildcard covers one label only
		{"example.com", nil, "default"},             // nor the bare domain
		{"default.example", nil, "default"},         // exact on the default
		{"wrong.test", nil, "default"},              // no match: the first given
		{"", nil, "default"},                        // no SNI
		{"", ip("192.0.2.9"), "ip"},                 // no SNI: the local IP
		{"", ip("192.0.2.10"), "default"},           // no SNI, other IP
		{"www.example.com", ip("192.0.2.9"), "www"}, // SNI wins over the IP
		{".", nil, "default"},
		{"*.example.com", nil, "default"}, // a wildcard is no SNI name
	} {
		c, err := s.GetCertificate(&tls.ClientHelloInfo{ServerName: tc.sni, Conn: tc.conn})
		if err != nil {
			t.Fatal(err)
		}
		var got string
		for _, ci := range s.Certs() {
			if ci.Serial == strings.ToUpper(c.Leaf.SerialNumber.Text(16)) {
				got = byFile[ci.File]
			}
		}
		if got != tc.want {
			t.Errorf("SNI %q conn %v: %s; want %s", tc.sni, tc.conn != nil, got, tc.want)
		}
	}
}

// TestSNIHandshake: real handshakes for two names and a wrong one, which
// gets the default certificate (and so fails the client's verification).
func TestSNIHandshake(t *testing.T) {
	s, _ := sniStore(t)
	srv := s.ServerConfig("h2", "http/1.1")
	for _, tc := range []struct {
		sni      string
		wantName string
		verifies bool
	}{
		{"www.example.com", "www.example.com", true},
		{"shop.example.com", "*.example.com", true},
		{"wrong.test", "default.example", false},
	} {
		cli := clientFor(tc.sni)
		cli.NextProtos = []string{"http/1.1", "h2"} // the server's preference wins
		cli.InsecureSkipVerify = !tc.verifies
		cs, err := handshake(t, srv, cli)
		if err != nil {
			t.Errorf("%s: %v", tc.sni, err)
			continue
		}
		if got := cs.PeerCertificates[0].DNSNames[0]; got != tc.wantName {
			t.Errorf("%s: certificate for %s; want %s", tc.sni, got, tc.wantName)
		}
		if cs.NegotiatedProtocol != "h2" {
			t.Errorf("%s: ALPN %q; want h2", tc.sni, cs.NegotiatedProtocol)
		}
		if !tc.verifies {
			if _, err := handshake(t, srv, clientFor(tc.sni)); err == nil {
				t.Errorf("%s: a verifying client accepted the default certificate", tc.sni)
			}
		}
	}
}

// TestServerConfigVersions: TLS 1.2 and 1.3 only.
func TestServerConfigVersions(t *testing.T) {
	s, _ := sniStore(t)
	srv := s.ServerConfig()
	for _, tc := range []struct {
		min, max uint16
		ok       bool
	}{
		{tls.VersionTLS10, tls.VersionTLS11, false},
		{tls.VersionTLS12, tls.VersionTLS12, true},
		{tls.VersionTLS13, tls.VersionTLS13, true},
	} {
		cli := clientFor("www.example.com")
		cli.MinVersion, cli.MaxVersion = tc.min, tc.max
		cs, err := handshake(t, srv, cli)
		if (err == nil) != tc.ok {
			t.Errorf("client %x-%x: %v; want ok %v", tc.min, tc.max, err, tc.ok)
		}
		if err == nil && cs.Version != tc.max {
			t.Errorf("client %x-%x: version %x", tc.min, tc.max, cs.Version)
		}
		if err == nil && cs.NegotiatedProtocol != "" {
			t.Errorf("no ALPN offered, %q negotiated", cs.NegotiatedProtocol)
		}
	}
}

// TestDualCertificates: an ECDSA and an RSA certificate for one name; a
// client that takes only RSA gets the RSA one.
func TestDualCertificates(t *testing.T) {
	dir := t.TempDir()
	ec := combined(t, dir, "ec.pem", certOpts{dns: []string{"www.example.com"}})
	rk := testKey(t, "rsa", 0)
	rsaFile := writeFile(t, dir, "rsa.pem", append(certPEM(makeCert(t, certOpts{dns: []string{"www.example.com"}, key: rk})), keyPEM(t, rk, "pkcs1")...))
	s, err := New(Config{Certs: []string{ec, rsaFile}, HandshakeTimeout: time.Second}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	cli := clientFor("www.example.com")
	cs, err := handshake(t, s.ServerConfig(), cli)
	if err != nil || cs.PeerCertificates[0].PublicKeyAlgorithm != x509.ECDSA {
		t.Fatalf("modern client: %v, %v; want ECDSA", err, cs.PeerCertificates)
	}
	cli = clientFor("www.example.com")
	cli.MaxVersion = tls.VersionTLS12
	cli.CipherSuites = []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}
	cs, err = handshake(t, s.ServerConfig(), cli)
	if err != nil || cs.PeerCertificates[0].PublicKeyAlgorithm != x509.RSA {
		t.Fatalf("RSA-only client: %v; want RSA", err)
	}
}

// reloadFixture is a store of one certificate file with a separate key
// file, on an injected clock.
type reloadFixture struct {
	dir, cert, key string
	clock          *wallClock
	ev             *events
	reloaded       []string
	s              *Store
}

func newReloadFixture(t *testing.T) *reloadFixture {
	f := &reloadFixture{dir: t.TempDir(), clock: newWallClock(), ev: &events{}}
	k := testKey(t, "ecdsa", 0)
	f.cert = writeFile(t, f.dir, "site.pem", certPEM(makeCert(t, certOpts{dns: []string{"www.example.com"}, key: k, serial: 100})))
	f.key = writeFile(t, f.dir, "site.key", keyPEM(t, k, "sec1"))
	var err error
	f.s, err = New(Config{Certs: []string{f.cert + ",key=" + f.key}, HandshakeTimeout: time.Second}, Deps{
		Events: f.ev.sink, Now: f.clock.Now,
		Reloaded: func(spec string, err error) { f.reloaded = append(f.reloaded, spec) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *reloadFixture) serial(t *testing.T) string {
	t.Helper()
	c, err := f.s.GetCertificate(&tls.ClientHelloInfo{ServerName: "www.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf.SerialNumber.String()
}

// TestReloadKeepsOldOnBadFile: each kind of bad new file is refused with
// an error naming it and an event; the old certificate stays in service.
func TestReloadKeepsOldOnBadFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, f *reloadFixture)
		is    error
	}{
		{"wrong key", func(t *testing.T, f *reloadFixture) {
			replaceFile(t, f.key, keyPEM(t, testKey(t, "ecdsa", 1), "pkcs8"))
		}, ErrKeyMismatch},
		{"expired", func(t *testing.T, f *reloadFixture) {
			replaceFile(t, f.cert, certPEM(makeCert(t, certOpts{dns: []string{"www.example.com"}, notBefore: time.Now().Add(-72 * time.Hour), notAfter: time.Now().Add(-time.Hour)})))
		}, ErrExpired},
		{"not yet valid", func(t *testing.T, f *reloadFixture) {
			replaceFile(t, f.cert, certPEM(makeCert(t, certOpts{dns: []string{"www.example.com"}, notBefore: time.Now().Add(time.Hour)})))
		}, ErrNotYetValid},
		{"no names", func(t *testing.T, f *reloadFixture) {
			replaceFile(t, f.cert, certPEM(makeCert(t, certOpts{})))
		}, ErrNoNames},
		{"unreadable", func(t *testing.T, f *reloadFixture) {
			os.Remove(f.cert)
		}, os.ErrNotExist},
		{"half written", func(t *testing.T, f *reloadFixture) {
			pem := certPEM(makeCert(t, certOpts{dns: []string{"www.example.com"}}))
			replaceFile(t, f.cert, pem[:len(pem)/2])
		}, ErrNotPEM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newReloadFixture(t)
			tc.write(t, f)
			err := f.s.Reload()
			if !errors.Is(err, tc.is) {
				t.Fatalf("Reload: %v; want %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), f.dir) {
				t.Errorf("error %v names no file", err)
			}
			if got := f.serial(t); got != "100" {
				t.Errorf("serving serial %s; want the old 100", got)
			}
			if n := f.ev.count(EventCertRefused); n != 1 {
				t.Errorf("%d refusal events; want 1 (%v)", n, f.ev.kinds())
			}
			if st := f.s.Stats(); st.ReloadFailed != 1 || st.ReloadOK != 0 {
				t.Errorf("stats %+v", st)
			}
			ci := f.s.Certs()[0]
			if ci.Serial != "64" || ci.ReloadError == "" {
				t.Errorf("status %+v: want serial 64 (hex of 100) and the reload error", ci)
			}
		})
	}
}

// TestReloadPicksNew: a good new file serves new handshakes; a handshake
// made before keeps its certificate and its connection works on.
func TestReloadPicksNew(t *testing.T) {
	f := newReloadFixture(t)
	srv := f.s.ServerConfig()
	// An established connection before the reload.
	a, b := tcpPair(t)
	defer a.Close()
	defer b.Close()
	sc := tls.Server(a, srv)
	go sc.Handshake()
	cc := tls.Client(b, clientFor("www.example.com"))
	if err := cc.Handshake(); err != nil {
		t.Fatal(err)
	}

	k := testKey(t, "ecdsa", 1)
	replaceFile(t, f.cert, certPEM(makeCert(t, certOpts{dns: []string{"www.example.com"}, key: k, serial: 200})))
	replaceFile(t, f.key, keyPEM(t, k, "pkcs8"))
	if err := f.s.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := f.serial(t); got != "200" {
		t.Fatalf("serving %s after reload; want 200", got)
	}
	if f.ev.count(EventCertLoaded) != 1 || f.s.Stats().ReloadOK != 1 || f.s.Certs()[0].ReloadError != "" {
		t.Errorf("events %v stats %+v", f.ev.kinds(), f.s.Stats())
	}
	// The old connection still carries data.
	go sc.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := cc.Read(buf); err != nil || string(buf) != "ping" {
		t.Fatalf("old connection after reload: %q %v", buf, err)
	}
	if s := cc.ConnectionState().PeerCertificates[0].SerialNumber.String(); s != "100" {
		t.Errorf("old connection's certificate %s", s)
	}
	cs, err := handshake(t, srv, clientFor("www.example.com"))
	if err != nil || cs.PeerCertificates[0].SerialNumber.String() != "200" {
		t.Fatalf("new handshake: %v", err)
	}
	// Reloading the same files again swaps nothing, fires no event, and
	// counts as unchanged, not as a reload that took.
	if err := f.s.Reload(); err != nil || f.ev.count(EventCertLoaded) != 1 {
		t.Errorf("second reload: %v, events %v", err, f.ev.kinds())
	}
	if st := f.s.Stats(); st.ReloadOK != 1 || st.ReloadUnchanged != 1 || st.ReloadFailed != 0 {
		t.Errorf("stats after the same files again: %+v, want 1 ok, 1 unchanged", st)
	}
}

// TestPollReloadsChangedFiles: Poll reads only files that changed; a
// certificate written before its key is refused, then taken when the key
// follows.
func TestPollReloadsChangedFiles(t *testing.T) {
	f := newReloadFixture(t)
	if err := f.s.Poll(); err != nil || len(f.reloaded) != 0 {
		t.Fatalf("Poll without change: %v, loads %v", err, f.reloaded)
	}
	k := testKey(t, "ecdsa", 1)
	replaceFile(t, f.cert, certPEM(makeCert(t, certOpts{dns: []string{"www.example.com"}, key: k, serial: 300})))
	if err := f.s.Poll(); !errors.Is(err, ErrKeyMismatch) {
		t.Fatalf("Poll with the new certificate only: %v; want a key mismatch", err)
	}
	if err := f.s.Poll(); err != nil || len(f.reloaded) != 1 {
		t.Fatalf("Poll again without change: %v, loads %v (want no retry until a file changes)", err, f.reloaded)
	}
	if f.serial(t) != "100" {
		t.Fatal("the half-renewed pair replaced the old certificate")
	}
	replaceFile(t, f.key, keyPEM(t, k, "pkcs8"))
	if err := f.s.Poll(); err != nil {
		t.Fatalf("Poll with the key: %v", err)
	}
	if got := f.serial(t); got != "300" || len(f.reloaded) != 2 {
		t.Fatalf("serving %s, loads %v", got, f.reloaded)
	}
	// Watch polls at each tick.
	replaceFile(t, f.cert, certPEM(makeCert(t, certOpts{dns: []string{"www.example.com"}, key: k, serial: 400})))
	ticks := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.s.Watch(ctx, ticks); close(done) }()
	ticks <- time.Now()
	ticks <- time.Now() // the first tick's poll is over when the second is taken
	cancel()
	<-done
	if got := f.serial(t); got != "400" {
		t.Fatalf("after Watch ticks: serving %s; want 400", got)
	}
}

// TestExpiryEvent: the event fires once per certificate when it comes
// within 14 days of expiry, and at load when it already is.
func TestExpiryEvent(t *testing.T) {
	dir := t.TempDir()
	clock := newWallClock()
	ev := &events{}
	k := testKey(t, "ecdsa", 0)
	longer := writeFile(t, dir, "long.pem", append(certPEM(makeCert(t, certOpts{dns: []string{"long.example"}, notAfter: time.Now().Add(20 * 24 * time.Hour)})), keyPEM(t, k, "pkcs8")...))
	short := writeFile(t, dir, "short.pem", append(certPEM(makeCert(t, certOpts{dns: []string{"short.example"}, notAfter: time.Now().Add(10 * 24 * time.Hour)})), keyPEM(t, k, "pkcs8")...))
	s, err := New(Config{Certs: []string{longer, short}, HandshakeTimeout: time.Second}, Deps{Events: ev.sink, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	subjects := func() []string {
		var out []string
		for _, e := range ev.evs {
			if e.Kind == EventCertExpiring {
				out = append(out, e.Subject)
			}
		}
		return out
	}
	steps := []struct {
		advance time.Duration
		want    []string
	}{
		{0, []string{short}},                           // at load: already within
		{5 * 24 * time.Hour, []string{short}},          // long: 15 days left
		{24 * time.Hour, []string{short, longer}},      // long: 14 days left
		{24 * time.Hour, []string{short, longer}},      // once only
		{30 * 24 * time.Hour, []string{short, longer}}, // expired while serving: no second event
	}
	for i, st := range steps {
		clock.Add(st.advance)
		if i > 0 {
			s.Poll()
		}
		if got := subjects(); strings.Join(got, " ") != strings.Join(st.want, " ") {
			t.Errorf("step %d: expiry events for %v; want %v", i, got, st.want)
		}
	}
	for _, ci := range s.Certs() {
		if ci.SecondsToExpiry >= 0 {
			t.Errorf("%s: %d seconds to expiry after it expired", ci.File, ci.SecondsToExpiry)
		}
	}
}
