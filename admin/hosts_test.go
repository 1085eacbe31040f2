package admin

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAdminHostGuard: a DNS-rebinding page (Host rebind.evil.example, its
// own origin, Sec-Fetch-Site same-origin) cannot disable a backend or read
// /status, /healthz or anything else; the listener's own names and the
// -admin-host names still work; each refusal is counted, logged once per
// source.
func TestAdminHostGuard(t *testing.T) {
	r := newControlRig(t)
	var logs syncBuffer
	r.srv.logger = slog.New(slog.NewTextHandler(&logs, nil))
	r.srv.Handle("GET /healthz", Healthz(nil))
	r.srv.Handle("GET /status", StatusHandler(Source{Backends: func() []BackendStatus {
		return []BackendStatus{FromBackend(r.pool.Lookup("b2").Status(0), nil)}
	}}))
	if err := r.srv.AllowHosts("127.0.0.1:0", []string{"admin.example.com", "proxy.example:8443"}); err != nil {
		t.Fatal(err)
	}
	ln, err := newLocalListener()
	if err != nil {
		t.Fatal(err)
	}
	go r.srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := contextWithTimeout(5 * time.Second)
		defer cancel()
		r.srv.Shutdown(ctx)
	})
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	client := &http.Client{Timeout: 5 * time.Second}
	send := func(method, path, host string, hdr map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s Host %q: %v", method, path, host, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	evil := "rebind.evil.example:" + port
	rebind := map[string]string{"Origin": "http://" + evil, "Sec-Fetch-Site": "same-origin"}
	refused := 0
	for _, c := range []struct {
		method, path, host string
	}{
		{"POST", "/control/backends/b2/disable", evil},
		{"GET", "/status", evil},
		{"GET", "/healthz", evil},
		{"GET", "/control/config", evil},
		{"GET", "/status", "localhost"},              // port 80, not the listener's
		{"GET", "/status", "127.0.0.1:1"},            // another port
		{"GET", "/status", "admin.example.com.evil"}, // not the name given
		{"GET", "/status", "proxy.example:8444"},     // the name given with another port
		{"GET", "/status", "0.0.0.0:" + port},
	} {
		code, body := send(c.method, c.path, c.host, rebind)
		refused++
		if code != http.StatusMisdirectedRequest {
			t.Errorf("%s %s Host %q: %d %q, want 421", c.method, c.path, c.host, code, body)
		}
		if strings.Contains(body, "127.0.0.1:10002") || strings.Contains(body, "invites") {
			t.Errorf("%s %s Host %q: answer shows the node's state: %q", c.method, c.path, c.host, body)
		}
	}
	if r.pool.Lookup("b2").Disabled() {
		t.Fatal("a request for Host rebind.evil.example disabled backend b2")
	}

	// No Host at all (HTTP/1.0): refused too.
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(conn, "GET /status HTTP/1.0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	refused++
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("request without Host: %d, want 421", resp.StatusCode)
	}

	for _, host := range []string{addr, "localhost:" + port, "LOCALHOST:" + port, "127.0.0.2:" + port, "admin.example.com", "Admin.Example.com:9999", "proxy.example:8443"} {
		if code, body := send("GET", "/status", host, nil); code != 200 || !strings.Contains(body, "127.0.0.1:10002") {
			t.Errorf("GET /status Host %q: %d %q, want 200 with the backends", host, code, body)
		}
	}
	// The origin check still holds for an allowed Host.
	if code, _ := send("POST", "/control/backends/b2/disable", addr, map[string]string{"Origin": "http://other.example", "Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden {
		t.Errorf("cross-site POST for the right Host: %d, want 403", code)
	}
	if code, body := send("POST", "/control/backends/b2/disable", "localhost:"+port, nil); code != 200 || !r.pool.Lookup("b2").Disabled() {
		t.Errorf("POST disable for Host localhost: %d %q, disabled %v; want 200 and disabled", code, body, r.pool.Lookup("b2").Disabled())
	}

	if got := r.srv.Misdirected(); got != uint64(refused) {
		t.Errorf("Misdirected() = %d, want %d", got, refused)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.srv.Collector())
	fams, err := reg.Gather()
	if err != nil || len(fams) != 1 || fams[0].GetName() != "sluice_admin_misdirected_total" || fams[0].GetMetric()[0].GetCounter().GetValue() != float64(refused) {
		t.Errorf("metrics: %v, %v; want sluice_admin_misdirected_total %d", fams, err, refused)
	}
	if n := strings.Count(logs.String(), "(421)"); n != 1 {
		t.Errorf("%d log lines about misdirected requests from one source, want 1:\n%s", n, logs.String())
	}
}

// TestHostPolicy: the listen address as written, the address a request
// arrived on, IPv6 literals and -admin-host parsing.
func TestHostPolicy(t *testing.T) {
	local := &net.TCPAddr{IP: net.ParseIP("10.0.0.5"), Port: 9090}
	for _, c := range []struct {
		listen string
		names  []string
		host   string
		local  net.Addr
		want   bool
	}{
		{"sluice.internal:9090", nil, "sluice.internal:9090", local, true},
		{"sluice.internal:9090", nil, "sluice.internal:9091", local, false},
		{"0.0.0.0:9090", nil, "10.0.0.5:9090", local, true},  // the address it arrived on
		{"0.0.0.0:9090", nil, "10.0.0.6:9090", local, false}, // another address
		{"0.0.0.0:9090", nil, "0.0.0.0:9090", local, false},
		{":9090", nil, "[::1]:9090", local, true},
		{":9090", nil, "[::1]", local, false},
		{":9090", nil, "::1", local, false},
		{":9090", nil, "evil.example:9090", local, false},
		{":9090", []string{"Evil.Example"}, "evil.example:9090", local, true},
		{"127.0.0.1:9090", nil, "127.0.0.1:9090", nil, true}, // no connection: the listen port
		{"127.0.0.1:0", nil, "127.0.0.1:9090", nil, false},   // no connection, no port known
	} {
		s := New(nil)
		if err := s.AllowHosts(c.listen, c.names); err != nil {
			t.Fatal(err)
		}
		host, port, ok := splitHost(c.host, "80")
		if got := ok && s.hosts.Load().allows(host, port, c.local, ""); got != c.want {
			t.Errorf("listen %s, names %v: Host %q allowed = %v, want %v", c.listen, c.names, c.host, got, c.want)
		}
	}
	for _, bad := range []string{"", "http://admin.example.com", "admin.example.com/", "*.example.com", "a b", "name:0", "name:x", "name:"} {
		if _, err := ParseHost(bad); err == nil {
			t.Errorf("ParseHost(%q) accepted", bad)
		}
	}
	if r, err := ParseHost("[::1]:9443"); err != nil || r != (HostRule{Host: "::1", Port: "9443"}) {
		t.Errorf("ParseHost([::1]:9443) = %+v, %v", r, err)
	}
}

// TestAdminNotFramable: every answer of the admin listener forbids framing
// by another page (clickjacking the dashboard's buttons: the click would be
// a same-origin request of the admin page itself).
func TestAdminNotFramable(t *testing.T) {
	r := newControlRig(t)
	r.srv.Handle("GET /healthz", Healthz(nil))
	for _, path := range []string{"/healthz", "/control/config"} {
		rec := httptest.NewRecorder()
		r.srv.Handler().ServeHTTP(rec, onLoopback(httptest.NewRequest("GET", path, nil)))
		if rec.Header().Get("X-Frame-Options") != "DENY" || rec.Header().Get("Content-Security-Policy") != "frame-ancestors 'none'" {
			t.Errorf("GET %s: X-Frame-Options %q, Content-Security-Policy %q; want DENY and frame-ancestors 'none'", path,
				rec.Header().Get("X-Frame-Options"), rec.Header().Get("Content-Security-Policy"))
		}
	}
}
