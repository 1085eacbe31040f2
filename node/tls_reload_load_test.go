package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelb/sluice/tlsedge"
)

// TestHTTPSReloadUnderLoad: certificates replaced while HTTPS clients run
// (keep-alive ones and one new connection per request, over HTTP/1.1 and
// HTTP/2): good files, a bad file (refused, the old certificate serves
// on) and a good one again. Not one request fails, connections made
// before a reload keep working, and new handshakes see the certificate
// of the last good file.
func TestHTTPSReloadUnderLoad(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer be.Close()
	dir := t.TempDir()
	cert := selfSigned(t, dir, "site.pem", 100, "www.example.com")
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{be.Listener.Addr().String() + ",id=b1"}
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.HTTP.TLSListen = "127.0.0.1:0"
	cfg.HTTP.MaxConns = 256
	cfg.TLS = tlsedge.DefaultConfig()
	cfg.TLS.Certs = []string{cert}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	addr := n.Addrs().HTTPS.String()

	// Test certificates are self-signed and change on every reload: the
	// clients check the name and record the serial they were shown.
	var lastSerial atomic.Int64
	clientTLS := func() *tls.Config {
		return &tls.Config{ServerName: "www.example.com", InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				leaf := cs.PeerCertificates[0]
				if err := leaf.VerifyHostname("www.example.com"); err != nil {
					return err
				}
				lastSerial.Store(leaf.SerialNumber.Int64())
				return nil
			}}
	}
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	clients := map[string]*http.Client{
		"keep-alive h1": {Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS(), DialContext: dial}},
		"new conn h1":   {Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS(), DialContext: dial, DisableKeepAlives: true}},
		"keep-alive h2": {Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS(), DialContext: dial, ForceAttemptHTTP2: true}},
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var okCount, failed atomic.Int64
	var firstErr atomic.Value
	for name, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000; i++ { // bounded; stop ends it first
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.Get("https://www.example.com/")
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || string(b) != "ok" {
						err = fmt.Errorf("%d %q", resp.StatusCode, b)
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%s: %v", name, err))
					continue
				}
				okCount.Add(1)
			}
		}()
	}
	waitOK := func(more int64) {
		t.Helper()
		want := okCount.Load() + more
		for end := time.Now().Add(20 * time.Second); okCount.Load() < want; {
			if time.Now().After(end) {
				t.Fatalf("clients stalled at %d requests", okCount.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitOK(50)
	for serial := int64(101); serial <= 104; serial++ {
		if serial == 103 {
			// A bad file: refused, and the certificate of 102 serves on.
			if err := writeFile(cert, []byte("not a certificate\n")); err != nil {
				t.Fatal(err)
			}
			if err := n.ReloadTLS(); err == nil {
				t.Fatal("a bad certificate file was taken")
			}
			waitOK(50)
			continue
		}
		selfSigned(t, dir, "site.pem", serial, "www.example.com")
		if err := n.ReloadTLS(); err != nil {
			t.Fatal(err)
		}
		waitOK(50)
	}
	close(stop)
	wg.Wait()
	if f := failed.Load(); f != 0 {
		t.Fatalf("%d of %d requests failed across the reloads; first: %v", f, f+okCount.Load(), firstErr.Load())
	}
	// A new handshake now gets the last good certificate.
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS(), DialContext: dial, DisableKeepAlives: true}}
	resp, err := c.Get("https://www.example.com/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := lastSerial.Load(); got != 104 {
		t.Errorf("a new handshake after the reloads saw serial %d, want 104", got)
	}
	t.Logf("%d requests, 0 failed, across 3 good reloads and 1 refused", okCount.Load())
}

// writeFile replaces path's content at once (write then rename), as an
// operator's deploy does.
func writeFile(path string, data []byte) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
