package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/node"
)

func TestRunBadFlags(t *testing.T) {
	dir := t.TempDir()
	base := []string{"-data-dir", dir, "-http-listen", "127.0.0.1:0", "-admin-listen", "", "-http-backend", "127.0.0.1:1"}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no backends", []string{"-data-dir", dir}, nil, "-http-backend"},
		{"bad backend", append(base, "-http-backend", "nohost"), nil, "-http-backend"},
		{"bad policy", append(base, "-lb-policy", "fastest"), nil, "-lb-policy"},
		{"bad max heap", append(base, "-mop-max-heap", "150"), nil, "-mop-max-heap"},
		{"bad window", append(base, "-mop-window", "-1s"), nil, "-mop-window"},
		{"bad initial rate", append(base, "-mop-initial-rate", "0"), nil, "-mop-initial-rate"},
		{"bad reject code", append(base, "-mop-reject-code", "200"), nil, "-mop-reject-code"},
		{"bad mem order", append(base, "-mem-low", "0.9", "-mem-lower", "0.8"), nil, "-mem-low"},
		{"bad mem limit", append(base, "-mem-limit", "lots"), nil, "-mem-limit"},
		{"bad arm", append(base, "-arm", "name=x"), nil, "-arm"},
		{"bad hash key", append(base, "-http-hash-key", "body"), nil, "-http-hash-key"},
		{"bad trusted proxy", append(base, "-http-trusted-proxy", "10.0.0.0/99"), nil, "-http-trusted-proxy"},
		{"bad health fall", append(base, "-health-fall", "0"), nil, "-health-fall"},
		{"zero health timeout", append(base, "-health-timeout", "0"), nil, "-health-timeout"},
		{"health timeout over interval", append(base, "-health-timeout", "5s"), nil, "-health-timeout"},
		{"zero max conns", append(base, "-http-backend-max-conns", "0"), nil, "-http-backend-max-conns"},
		{"negative client conns", append(base, "-http-max-conns", "-1"), nil, "-http-max-conns"},
		{"negative conns per source", append(base, "-http-max-conns-per-source", "-5"), nil, "-http-max-conns-per-source"},
		{"bad metrics selector", append(base, "-http-backend", "127.0.0.1:2,metrics=http://x/m", "-mop-used-metric", "a{"), nil, "-mop-used-metric"},
		{"metrics limit too large", append(base, "-http-backend", "127.0.0.1:2,metrics=http://x/m", "-mop-probe-max-bytes", "1GiB"), nil, "-mop-probe-max-bytes"},
		{"metrics limit too large, no metrics backend yet", append(base, "-mop-probe-max-bytes", "1GiB"), nil, "-mop-probe-max-bytes"},
		{"bad metrics selector, no metrics backend yet", append(base, "-mop-max-metric", "a{"), nil, "-mop-max-metric"},
		{"bad sip setting, no sip backend", append(base, "-sip-unknown-dialog", "drop"), nil, "-sip-unknown-dialog"},
		{"zero per-source sip tcp cap", append(base, "-sip-tcp-max-conns-per-source", "0"), nil, "-sip-tcp-max-conns-per-source 0: want a positive value (default 256)"},
		{"zero first-message timeout from the environment", base, map[string]string{"SLUICE_SIP_TCP_FIRST_MESSAGE_TIMEOUT": "0s"}, "-sip-tcp-first-message-timeout 0"},
		{"zero metrics limit", append(base, "-mop-probe-max-bytes", "0"), nil, "-mop-probe-max-bytes"},
		{"bad log level", append(base, "-log-level", "loud"), nil, "-log-level"},
		{"bad duration", append(base, "-http-sticky-ttl", "soon"), nil, "-http-sticky-ttl"},
		{"unknown flag", append(base, "-frobnicate"), nil, "-frobnicate"},
		{"bad env", base, map[string]string{"SLUICE_HTTP_STICKY_TTL": "soon"}, "SLUICE_HTTP_STICKY_TTL (-http-sticky-ttl)"},
		{"bad env list", base, map[string]string{"SLUICE_ARM": "name=x,limit=1/s name=y"}, "SLUICE_ARM (-arm)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			// A run that starts by mistake ends with the context.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			code := run(ctx, tc.args, io.Discard, &stderr, nil)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want 2 and a message naming %s", code, stderr.String(), tc.want)
			}
		})
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1024": 1024, "1K": 1024, "512MiB": 512 << 20, "2G": 2 << 30, "3 GB": 3 << 30, "1t": 1 << 40} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1X", "1.5G"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) succeeded", in)
		}
	}
}

// TestRunServes starts `sluice run` in-process against two loopback
// backends, checks forwarding, /healthz and /status, and stops it.
func TestRunServes(t *testing.T) {
	var backends []*httptest.Server
	var args []string
	for i := range 2 {
		name := fmt.Sprintf("b%d", i)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, name)
		}))
		defer srv.Close()
		backends = append(backends, srv)
		args = append(args, "-http-backend", srv.Listener.Addr().String()+",id="+name)
	}
	// The environment gives the listen address; the command line wins over
	// it for the policy.
	t.Setenv("SLUICE_HTTP_LISTEN", "127.0.0.1:0")
	t.Setenv("SLUICE_LB_POLICY", "consistent-hash")
	args = append(args, "-lb-policy", "round-robin", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-arm", "name=api,path=/api/,limit=100/s", "-health-interval", "100ms")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan [2]net.Addr, 1)
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		done <- run(ctx, args, io.Discard, &stderr, &runHooks{ready: func(h, a net.Addr) { ready <- [2]net.Addr{h, a} }})
	}()
	var addrs [2]net.Addr
	select {
	case addrs = <-ready:
	case code := <-done:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	seen := map[string]int{}
	for range 10 {
		code, body := get("http://" + addrs[0].String() + "/api/x")
		if code != 200 {
			t.Fatalf("proxied GET: %d %s", code, body)
		}
		seen[body]++
	}
	if seen["b0"] != 5 || seen["b1"] != 5 {
		t.Errorf("round robin (flag over env) spread = %v, want 5 and 5", seen)
	}
	if code, body := get("http://" + addrs[1].String() + "/healthz"); code != 200 || strings.TrimSpace(body) != "normal" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	code, body := get("http://" + addrs[1].String() + "/status")
	if code != 200 {
		t.Fatalf("/status = %d", code)
	}
	var st struct {
		MemoryState string `json:"memory_state"`
		Backends    []struct {
			ID       string `json:"id"`
			Protocol string `json:"protocol"`
			State    string `json:"state"`
		} `json:"backends"`
		ARM []struct {
			Name  string `json:"name"`
			Rate  int64  `json:"rate"`
			Limit int64  `json:"limit"`
		} `json:"arm"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v: %s", err, body)
	}
	if st.MemoryState != "normal" || len(st.Backends) != 2 || st.Backends[0].ID != "b0" || st.Backends[0].Protocol != "http" ||
		st.Backends[0].State != "up" || len(st.ARM) != 1 || st.ARM[0].Name != "api" || st.ARM[0].Limit != 100 || st.ARM[0].Rate != 10 {
		t.Errorf("/status = %s", body)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("run exited %d after cancel: %s", code, stderr.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunDataResetKeepsKey: the generated affinity key lives in the data
// directory, -data-reset still works, and the key survives it: sticky
// cookies issued before the reset stay valid.
func TestRunDataResetKeepsKey(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer backend.Close()
	dir := filepath.Join(t.TempDir(), "data")
	runOnce := func(extra ...string) (int, string) {
		args := append([]string{"-http-listen", "127.0.0.1:0", "-admin-listen", "", "-data-dir", dir,
			"-http-backend", backend.Listener.Addr().String()}, extra...)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var stderr syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, args, io.Discard, &stderr, &runHooks{ready: func(net.Addr, net.Addr) { cancel() }})
		}()
		select {
		case code := <-done:
			return code, stderr.String()
		case <-time.After(20 * time.Second):
			t.Fatal("run did not stop")
		}
		return -1, ""
	}
	if code, out := runOnce(); code != 0 {
		t.Fatalf("first run: exit %d: %s", code, out)
	}
	key1, err := os.ReadFile(filepath.Join(dir, "affinity.key"))
	if err != nil {
		t.Fatalf("default key file: %v", err)
	}
	if code, out := runOnce("-data-reset"); code != 0 {
		t.Fatalf("run with -data-reset: exit %d: %s", code, out)
	}
	key2, err := os.ReadFile(filepath.Join(dir, "affinity.key"))
	if err != nil || !bytes.Equal(key1, key2) {
		t.Errorf("key changed across -data-reset (%v)", err)
	}
}

// TestRunSIPServesThroughDrain: after SIGTERM (ctx cancelled) the SIP
// front end keeps its socket through the drain: a new INVITE is answered
// 503 (draining), not met with silence.
func TestRunSIPServesThroughDrain(t *testing.T) {
	backend, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	args := []string{"-sip-listen", "127.0.0.1:0", "-sip-backend", backend.LocalAddr().String() + ",id=s1", "-sip-health-interval", "0",
		"-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(), "-drain-timeout", "10s"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := make(chan node.Addrs, 1)
	exit := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		exit <- run(ctx, args, io.Discard, &stderr, &runHooks{addrs: func(a node.Addrs) { addrs <- a }})
	}()
	var sip, admin net.Addr
	select {
	case a := <-addrs:
		sip, admin = a.SIP, a.Admin
	case code := <-exit:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	cancel() // SIGTERM: the drain starts
	waitFor(t, 5*time.Second, "/healthz to say draining", func() bool {
		resp, err := http.Get("http://" + admin.String() + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 429
	})
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := c.LocalAddr().String()
	invite := "INVITE sip:bob@example.com SIP/2.0\r\n" +
		"Via: SIP/2.0/UDP " + local + ";branch=z9hG4bK-drain-1\r\n" +
		"Max-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=a1\r\nTo: <sip:bob@example.com>\r\n" +
		"Call-ID: drain-1@test\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@" + local + ">\r\nContent-Length: 0\r\n\r\n"
	var got string
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 4096)
	for got == "" && time.Now().Before(deadline) {
		c.WriteTo([]byte(invite), sip)
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				break
			}
			if line, _, _ := strings.Cut(string(buf[:n]), "\r\n"); !strings.Contains(line, " 100 ") {
				got = line
				break
			}
		}
	}
	if !strings.HasPrefix(got, "SIP/2.0 503") {
		t.Fatalf("INVITE during the drain: got %q, want a 503 (the SIP socket must stay open while draining)", got)
	}
}

// A bad value on the command line printed "parse error" and then the
// whole usage, 200 lines under which the error scrolled away: now the
// error says what the value should be and shows that flag's help alone;
// -help still prints everything.
func TestBadFlagShowsItsHelpOnly(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"-sip-tcp-first-message-timeout", "10"}, io.Discard, &stderr, nil); code != 2 {
		t.Fatalf("exit %d", code)
	}
	got := stderr.String()
	for _, want := range []string{`invalid value "10" for flag -sip-tcp-first-message-timeout`, "want a duration with its unit", "  -sip-tcp-first-message-timeout duration\n", "'sluice run -help'"} {
		if !strings.Contains(got, want) {
			t.Errorf("stderr lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "usage:") || strings.Count(got, "\n") > 8 {
		t.Errorf("the whole usage printed for one bad value:\n%s", got)
	}
	stderr.Reset()
	t.Setenv("SLUICE_HTTP_MAX_CONNS", "lots")
	run(context.Background(), []string{"-http-backend", "127.0.0.1:1"}, io.Discard, &stderr, nil)
	if !strings.Contains(stderr.String(), "SLUICE_HTTP_MAX_CONNS (-http-max-conns)") || !strings.Contains(stderr.String(), "want a whole number") {
		t.Errorf("environment: %s", stderr.String())
	}
	// A true/false flag: its value with a space (the flag package leaves
	// it as an argument) or a value it does not take.
	stderr.Reset()
	if code := run(context.Background(), []string{"-http-io-uring", "false"}, io.Discard, &stderr, nil); code != 2 ||
		!strings.Contains(stderr.String(), `unexpected argument "false" after -http-io-uring`) || !strings.Contains(stderr.String(), "-http-io-uring=false") {
		t.Errorf("bool flag with a space: exit %d\n%s", code, stderr.String())
	}
	stderr.Reset()
	t.Setenv("SLUICE_HTTP_IO_URING", "off")
	run(context.Background(), []string{"-http-backend", "127.0.0.1:1"}, io.Discard, &stderr, nil)
	if !strings.Contains(stderr.String(), "SLUICE_HTTP_IO_URING (-http-io-uring)") || !strings.Contains(stderr.String(), "want true or false") {
		t.Errorf("bool in the environment: %s", stderr.String())
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"-help"}, io.Discard, &stderr, nil); code != 0 || !strings.Contains(stderr.String(), "usage: sluice run") || !strings.Contains(stderr.String(), "-sip-tcp-partial-budget") {
		t.Errorf("-help: exit %d\n%s", code, stderr.String())
	}
}
