package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/tlsedge"
)

// TestNodeServesHTTPS: -https-listen beside -http-listen serves the same
// backends over both, the backend told the scheme; with -http-listen off
// only HTTPS is served; with -https-redirect the plain listener answers
// 308 to the HTTPS port.
func TestNodeServesHTTPS(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello ", r.Header.Get("X-Forwarded-Proto"))
	}))
	defer be.Close()
	// The certificate comes from the node's store (-tls-cert), as an
	// operator gives it: a PEM file with the key in it.
	certFile := selfSigned(t, t.TempDir(), "site.pem", 7, "www.example.com")
	pemBytes, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemBytes)
	client := &http.Client{
		Timeout:       10 * time.Second,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "www.example.com"}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	get := func(url string) (int, string, http.Header) {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	for _, tc := range []struct {
		name     string
		listen   string
		redirect bool
	}{
		{"beside", "127.0.0.1:0", false},
		{"instead", lbhttp.ListenOff, false},
		{"redirect", "127.0.0.1:0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.HTTPBackends = []string{be.Listener.Addr().String() + ",id=b1"}
			cfg.HTTP.Listen = tc.listen
			cfg.HTTP.TLSListen = "127.0.0.1:0"
			cfg.TLS = tlsedge.DefaultConfig()
			cfg.TLS.Certs = []string{certFile}
			cfg.HTTP.HTTPSRedirect = tc.redirect
			// One source, two connections (HTTPS, then plain) on loops of
			// their own: a per-source share of backend connections above 1.
			cfg.HTTP.MaxConns = 64
			n, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := n.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer n.Stop(time.Second)
			a := n.Addrs()
			if a.HTTPS == nil || (a.HTTP == nil) != (tc.listen == lbhttp.ListenOff) {
				t.Fatalf("addrs %+v", a)
			}
			if code, body, _ := get("https://" + a.HTTPS.String() + "/"); code != 200 || body != "hello https" {
				t.Fatalf("over HTTPS: %d %q", code, body)
			}
			// A client whose ALPN offers only http/1.0 (curl --http1.0) is
			// served, as by nginx, not refused with no_application_protocol.
			c10 := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: "www.example.com", NextProtos: []string{"http/1.0"}},
				ForceAttemptHTTP2: false,
			}}
			if resp, err := c10.Get("https://" + a.HTTPS.String() + "/"); err != nil {
				t.Fatalf("ALPN http/1.0 only: %v", err)
			} else {
				resp.Body.Close()
				if resp.TLS == nil || resp.TLS.NegotiatedProtocol != "http/1.0" || resp.StatusCode != 200 {
					t.Fatalf("ALPN http/1.0 only: %d, negotiated %+v", resp.StatusCode, resp.TLS)
				}
			}
			if a.HTTP == nil {
				return
			}
			code, body, h := get("http://" + a.HTTP.String() + "/p?q=1")
			_, port, _ := net.SplitHostPort(a.HTTPS.String())
			switch {
			case tc.redirect && (code != 308 || h.Get("Location") != "https://127.0.0.1:"+port+"/p?q=1"):
				t.Errorf("plain with -https-redirect: %d %q, want 308 to the HTTPS port", code, h.Get("Location"))
			case !tc.redirect && (code != 200 || body != "hello http"):
				t.Errorf("plain: %d %q", code, body)
			}
		})
	}
}

// TestNodeHTTPSNeedsCertificates: -https-listen without certificates, and
// -http-listen off without -https-listen, are refused naming the field.
func TestNodeHTTPSNeedsCertificates(t *testing.T) {
	for _, tc := range []struct{ listen, tlsListen, want string }{
		{"127.0.0.1:0", "127.0.0.1:0", "-tls-cert"},
		{lbhttp.ListenOff, "", "Listen"},
	} {
		cfg := testConfig(t)
		cfg.HTTPBackends = []string{"127.0.0.1:1,id=b1"}
		cfg.HTTP.Listen, cfg.HTTP.TLSListen = tc.listen, tc.tlsListen
		_, err := New(cfg, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("listen %q, https %q: %v, want an error naming %s", tc.listen, tc.tlsListen, err, tc.want)
		}
	}
}
