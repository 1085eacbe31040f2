package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// ctlListener serves the control endpoints and /status of a pool (b1, b2)
// and a controller (rule invites) on a loopback port.
func ctlListener(t *testing.T, tokens *admin.Tokens) (addr string, pool *lb.Pool, ctrl *admission.Controller) {
	t.Helper()
	b1, _ := lb.NewBackend(lb.BackendConfig{ID: "b1", Addr: "127.0.0.1:10001", Proto: "http"})
	b2, _ := lb.NewBackend(lb.BackendConfig{ID: "b2", Addr: "127.0.0.1:10002", Proto: "http"})
	pool, err := lb.NewPool(lb.PoolConfig{}, []*lb.Backend{b1, b2})
	if err != nil {
		t.Fatal(err)
	}
	rule, _ := admission.ParseRule("name=invites,proto=sip,limit=100/s")
	ctrl, err = admission.NewController(admission.ControllerConfig{Rules: []admission.RuleConfig{rule}}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	srv := admin.New(nil)
	srv.RequireTokens(tokens)
	pools := admin.PoolControl(func() []*lb.Pool { return []*lb.Pool{pool} })
	srv.Handle("GET /status", admin.StatusHandler(admin.Source{Controller: ctrl, Backends: func() []admin.BackendStatus {
		var out []admin.BackendStatus
		for _, b := range pool.Backends() {
			out = append(out, admin.FromBackend(b.Status(0), b.MOP()))
		}
		return out
	}}))
	admin.RegisterControl(srv, admin.ControlConfig{Operator: admin.Operators{
		admin.TargetBackend: pools,
		admin.TargetARM:     admin.RuleControl{Controller: ctrl, Now: func() int64 { return 0 }},
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return ln.Addr().String(), pool, ctrl
}

func ctl(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = runCtl(args, &o, &e)
	return code, o.String(), e.String()
}

func TestCtlExitCodes(t *testing.T) {
	addr, pool, ctrl := ctlListener(t, nil)
	b1 := pool.Lookup("b1")
	for _, tc := range []struct {
		args   []string
		code   int
		out    string // in stdout (0) or stderr (others)
		effect func() bool
	}{
		{[]string{"status"}, 0, "b1", nil},
		{[]string{"drain", "b1"}, 0, "drained false -> true", func() bool { return b1.State(0) == lb.Draining }},
		{[]string{"undrain", "b1"}, 0, "drained true -> false", func() bool { return b1.State(0) == lb.Up }},
		{[]string{"weight", "b1", "7"}, 0, "weight 1 -> 7", func() bool { return b1.Weight() == 7 }},
		{[]string{"weight", "b1", "0"}, 1, "400 Bad Request", func() bool { return b1.Weight() == 7 }},
		{[]string{"disable", "b9"}, 1, "no such backend", nil},
		{[]string{"mop", "pin", "b1", "50"}, 1, "no memory probe", nil},
		{[]string{"-protocol", "sip", "drain", "b1"}, 1, "of protocol sip", nil},
		{[]string{"arm", "set", "invites", "limit=500/s", "action=reject"}, 0, "limit=500/s,action=reject", func() bool {
			rc, _ := ctrl.Rule("invites")
			return rc.Limit == 500 && rc.Action == admission.ActionReject
		}},
		{[]string{"arm", "add", "name=api,limit=5/s"}, 0, "added name=api", nil},
		{[]string{"arm", "remove", "api"}, 0, "removed", nil},
		{[]string{"arm", "remove", "api"}, 1, "no such arm rule", nil},
		{[]string{"status"}, 0, "invites", nil},
		{[]string{"config"}, 1, "501", nil}, // no ConfigSource on this listener
		{[]string{}, 2, "no command", nil},
		{[]string{"weight", "b1"}, 2, "weight ID N", nil},
		{[]string{"frobnicate"}, 2, "unknown command", nil},
		{[]string{"mop", "pin", "b1"}, 2, "mop pin ID RATE", nil},
		{[]string{"-protocol", "ftp", "drain", "b1"}, 2, "want http or sip", nil},
		{[]string{"-nosuchflag", "status"}, 2, "not defined", nil},
	} {
		args := append([]string{"-admin", addr}, tc.args...)
		code, out, errOut := ctl(args...)
		got := out
		if tc.code != 0 {
			got = errOut
		}
		if code != tc.code || !strings.Contains(got, tc.out) {
			t.Errorf("sluice ctl %s = %d\nstdout %q\nstderr %q\nwant %d with %q", strings.Join(tc.args, " "), code, out, errOut, tc.code, tc.out)
		}
		if tc.effect != nil && !tc.effect() {
			t.Errorf("sluice ctl %s: no effect", strings.Join(tc.args, " "))
		}
	}
	// Nothing listens: 3.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	if code, _, errOut := ctl("-admin", dead, "status"); code != 3 || !strings.Contains(errOut, "not reachable") {
		t.Errorf("unreachable admin: %d %q, want 3", code, errOut)
	}
}

func TestCtlToken(t *testing.T) {
	tokens, err := admin.ParseTokens("t", []byte("ops 0123456789abcdef0123\n"))
	if err != nil {
		t.Fatal(err)
	}
	addr, pool, _ := ctlListener(t, tokens)
	if code, _, errOut := ctl("-admin", "http://"+addr, "drain", "b2"); code != 1 || !strings.Contains(errOut, "401") {
		t.Errorf("without a token: %d %q, want 1 and 401", code, errOut)
	}
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	os.WriteFile(good, []byte("# mine\nops 0123456789abcdef0123\n"), 0o600)
	os.WriteFile(bad, []byte("0123456789abcdef0000\n"), 0o600)
	if code, _, errOut := ctl("-admin", addr, "-token-file", bad, "drain", "b2"); code != 1 || !strings.Contains(errOut, "403") {
		t.Errorf("a wrong token: %d %q, want 1 and 403", code, errOut)
	}
	if code, _, errOut := ctl("-admin", addr, "-token-file", good, "drain", "b2"); code != 0 || pool.Lookup("b2").State(0) != lb.Draining {
		t.Errorf("with the token: %d %q", code, errOut)
	}
	if code, _, errOut := ctl("-admin", addr, "-token-file", filepath.Join(dir, "missing"), "drain", "b2"); code != 2 || !strings.Contains(errOut, "-token-file") {
		t.Errorf("a missing token file: %d %q, want 2", code, errOut)
	}
}

// TestRunningConfigRoundTrip: GET /control/config gives every setting of
// the running node (not only backends and rules) in the -config syntax,
// and a file of it is read back by -config to the same values.
func TestRunningConfigRoundTrip(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer be.Close()
	args := []string{"-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-http-backend", be.Listener.Addr().String() + ",id=b1", "-mop-window", "20s", "-lb-policy", "least-outstanding",
		"-mem-limit", "256MiB", "-drain-timeout", "3s", "-arm", "name=api,proto=http,limit=50/s,action=reject"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan net.Addr, 1)
	exit := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		exit <- run(ctx, args, io.Discard, &stderr, &runHooks{ready: func(_, a net.Addr) { ready <- a }})
	}()
	var admin net.Addr
	select {
	case admin = <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	resp, err := http.Get("http://" + admin.String() + "/control/config")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"\nmop-window 20s\n", "\nlb-policy least-outstanding\n", "\ndrain-timeout 3s\n", "\nhttp-backend ", "\narm name=api,"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("running config lacks %q:\n%s", strings.TrimSpace(want), body)
		}
	}
	file := filepath.Join(t.TempDir(), "running.conf")
	os.WriteFile(file, body, 0o600)
	fs := newFlagSet("run", io.Discard)
	o := newRunFlags(fs)
	if err := readConfigFile(fs, file, nil); err != nil {
		t.Fatalf("-config of the running configuration: %v", err)
	}
	if o.mop.Window != 20*time.Second || fs.Lookup("lb-policy").Value.String() != "least-outstanding" || len(o.arm.values) != 1 {
		t.Errorf("read back: mop-window %s, lb-policy %s, %d arm rules", o.mop.Window, fs.Lookup("lb-policy").Value, len(o.arm.values))
	}
}

// TestCtlTrustsNoAnswer: what the admin listener answers reaches the
// terminal without control characters (no escape sequence can clear the
// screen, retitle the window or hide text), and a redirect is not
// followed: the bearer token never goes to the port it points at.
func TestCtlTrustsNoAnswer(t *testing.T) {
	const evil = "b1\x1b[2J\x1b]0;owned\x07\r\u202eevil\u009b31m"
	leaked := make(chan string, 10)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked <- r.Method + " " + r.URL.Path + " " + r.Header.Get("Authorization")
		io.WriteString(w, "ok\n")
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/status":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"memory_state":"normal\u001b[31m","backends":[{"id":"b1\u001b[2J\u001b]0;owned\u0007\r\u202eevil\u009b31m","protocol":"http","addr":"127.0.0.1:1","state":"up"}],"arm":[{"name":"r\u001b[8m","unit":"s"}]}`)
		case "/control/config":
			io.WriteString(w, "http-listen :8080\n# "+evil+"\n")
		case "/control/backends/b1/drain":
			http.Redirect(w, r, other.URL+"/control/backends/b1/drain", http.StatusTemporaryRedirect)
		default:
			http.Error(w, "no backend "+evil, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("ops 0123456789abcdef0123456789abcdef\n"), 0o600)
	clean := func(what, s string) {
		t.Helper()
		if strings.ContainsAny(s, "\x1b\x07\r\u202e\u009b") {
			t.Errorf("%s carries control characters: %q", what, s)
		}
	}
	code, out, errOut := ctl("-admin", srv.URL, "status")
	if code != 0 || !strings.Contains(out, "b1[2J]0;ownedevil31m") {
		t.Errorf("status: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	clean("status", out)
	code, out, _ = ctl("-admin", srv.URL, "config")
	if code != 0 || !strings.Contains(out, "http-listen :8080\n") {
		t.Errorf("config: exit %d, stdout %q", code, out)
	}
	clean("config", out)
	code, _, errOut = ctl("-admin", srv.URL, "enable", "b9")
	if code != 1 || !strings.Contains(errOut, "no backend b1[2J]0;ownedevil31m") {
		t.Errorf("refusal: exit %d, stderr %q", code, errOut)
	}
	clean("refusal", errOut)

	code, _, errOut = ctl("-admin", srv.URL, "-token-file", tokenFile, "drain", "b1")
	if len(leaked) != 0 {
		t.Errorf("the redirect was followed, the other port got: %q", <-leaked)
	}
	if code != 1 || !strings.Contains(errOut, "redirect") {
		t.Errorf("redirect: exit %d, stderr %q; want 1 saying a redirect is not followed", code, errOut)
	}
}

// `sluice ctl status` says why a backend is not up (it said "down" and no
// more), and without a memory limit it says the states are off rather
// than "normal (N of 0 bytes)".
func TestPrintStatusReasonAndNoLimit(t *testing.T) {
	st := admin.Status{MemoryState: "normal", Memory: admin.MemoryStatus{UsedBytes: 1234, LimitSource: "none"},
		Backends: []admin.BackendStatus{
			{ID: "web1", Protocol: "http", Addr: "127.0.0.1:1", State: "up"},
			{ID: "web3", Protocol: "http", Addr: "127.0.0.1:2", State: "down", Reason: "down by its health checks: dial tcp: connection refused\x1b[2J"},
		}}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printStatus(&out, data); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if !strings.Contains(got, "memory states off") || strings.Contains(got, "of 0 bytes") {
		t.Errorf("no limit:\n%s", got)
	}
	if !strings.Contains(got, "http web3: down by its health checks: dial tcp: connection refused") || strings.Contains(got, "web1:") || strings.Contains(got, "\x1b") {
		t.Errorf("reasons:\n%s", got)
	}
}

// A 421 (the node does not answer to the name in -admin) says how to get
// past it: the listener's address, or -admin-host on the node.
func TestCtlMisdirectedHint(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "misdirected request", http.StatusMisdirectedRequest)
	}))
	defer srv.Close()
	code, _, errOut := ctl("-admin", srv.URL, "status")
	if code != 1 || !strings.Contains(errOut, "421") || !strings.Contains(errOut, "-admin-host 127.0.0.1") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

// A request that reached sluice and got no answer in -timeout is not
// "sluice not running": a POST may have been applied, and the exit code
// (4) differs from not reachable (3).
func TestCtlTimeoutAfterConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // reads, never answers
				defer c.Close()
				go io.Copy(io.Discard, c)
				<-done
			}()
		}
	}()
	addr := ln.Addr().String()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"route", "add", "http", "pool=api,path=/api/"}, []string{"timed out waiting for sluice", "the change may have been applied", "route list` before retrying"}},
		{[]string{"drain", "b1"}, []string{"timed out waiting for sluice", "the change may have been applied", "status` before retrying"}},
		{[]string{"status"}, []string{"timed out waiting for sluice"}},
	} {
		code, _, errOut := ctl(append([]string{"-admin", addr, "-timeout", "100ms"}, tc.args...)...)
		if code != ctlNoAnswer {
			t.Errorf("%v: exit %d, want %d", tc.args, code, ctlNoAnswer)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr %q lacks %q", tc.args, errOut, w)
			}
		}
		if strings.Contains(errOut, "is sluice running") || strings.Contains(errOut, "not reachable") {
			t.Errorf("%v: connected, yet %q", tc.args, errOut)
		}
	}
}

// sluice ctl status says so first when the last reload failed or dropped
// run-time changes, and says nothing of reloads otherwise.
func TestPrintStatusLastReload(t *testing.T) {
	at := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		reload *admin.ReloadStatus
		want   []string
		not    []string
	}{
		{"none", nil, nil, []string{"RELOAD"}},
		{"ok", &admin.ReloadStatus{Time: at, OK: true, Dropped: []string{}}, nil, []string{"RELOAD"}},
		{"failed", &admin.ReloadStatus{Time: at, Error: "-backends-file b:3: bad\x1b[2J"}, []string{"LAST RELOAD FAILED (2026-12-01T03:00:00Z): -backends-file b:3: bad"}, []string{"DROPPED", "\x1b"}},
		{"dropped", &admin.ReloadStatus{Time: at, OK: true, Dropped: []string{"backend/http/b2/weight=3 (by alice at 2026-12-01T02:00:00Z)"}},
			[]string{"LAST RELOAD DROPPED 1 run-time change(s) (2026-12-01T03:00:00Z)", "  backend/http/b2/weight=3 (by alice"}, []string{"FAILED"}},
	} {
		data, err := json.Marshal(admin.Status{MemoryState: "normal", LastReload: tc.reload})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := printStatus(&out, data); err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: lacks %q:\n%s", tc.name, w, out.String())
			}
		}
		for _, w := range tc.not {
			if strings.Contains(out.String(), w) {
				t.Errorf("%s: has %q:\n%s", tc.name, w, out.String())
			}
		}
	}
}

// Flags after the command work as before it; a word after the command
// that looks like a flag and is none is refused naming it, with where
// flags go.
func TestCtlFlagsAfterCommand(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		words []string
		proto string
		err   string
	}{
		{args: []string{"drain-pool", "default", "-protocol", "sip"}, words: []string{"drain-pool", "default"}, proto: "sip"},
		{args: []string{"drain-pool", "default", "--protocol=http"}, words: []string{"drain-pool", "default"}, proto: "http"},
		{args: []string{"-protocol", "http", "drain", "b1"}, words: []string{"drain", "b1"}, proto: "http"},
		{args: []string{"drain", "-protocol", "sip", "b1"}, words: []string{"drain", "b1"}, proto: "sip"},
		{args: []string{"drain", "--", "-odd-id"}, words: []string{"drain", "-odd-id"}},
		{args: []string{"drain-pool", "default", "-proto", "sip"}, err: "-proto after drain-pool: flags go before the command: sluice ctl [flags] COMMAND ..."},
		{args: []string{"drain-pool", "default", "-protocol"}, err: "flag needs an argument"},
	} {
		fs := flag.NewFlagSet("ctl", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		proto := fs.String("protocol", "", "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		words, err := ctlWords(fs)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(words, tc.words) || *proto != tc.proto {
			t.Errorf("%v: words %q protocol %q err %v; want %q %q", tc.args, words, *proto, err, tc.words, tc.proto)
		}
	}
	// End to end: the flag after the command reaches the listener.
	addr, _, _ := ctlListener(t, nil)
	if code, _, errOut := ctl("-admin", addr, "drain", "b1", "-protocol", "sip"); code != ctlRefused || !strings.Contains(errOut, "of protocol sip") {
		t.Errorf("drain b1 -protocol sip: %d %q, want the listener's refusal for protocol sip", code, errOut)
	}
	if code, _, errOut := ctl("-admin", addr, "drain-pool", "default", "-proto", "sip"); code != ctlUsage || !strings.Contains(errOut, "flags go before the command") {
		t.Errorf("unknown flag after the command: %d %q", code, errOut)
	}
}

// `sluice ctl status` says when a backend's memory probe fails: MOP then
// holds its rate (-mop-initial-rate for a backend that learned nothing)
// and refuses new work over it while the table shows the backend up and
// in discovery, with nothing else to tell a wrong metrics= URL.
func TestPrintStatusProbeFailing(t *testing.T) {
	st := admin.Status{MemoryState: "normal", Memory: admin.MemoryStatus{UsedBytes: 1234, LimitBytes: 1 << 30},
		Backends: []admin.BackendStatus{
			{ID: "web1", Protocol: "http", Addr: "127.0.0.1:1", State: "up",
				MOP: admin.MOPStatus{Enabled: true, Phase: "discovery", AllowedRate: 10, ProbeError: "poll memory 127.0.0.1:1: status 404\x1b[2J", ProbeFailures: 85}},
			{ID: "web2", Protocol: "http", Addr: "127.0.0.1:2", State: "up",
				MOP: admin.MOPStatus{Enabled: true, Phase: "learned", AllowedRate: 300, LearnedRate: 300}},
			{ID: "web3", Protocol: "http", Addr: "127.0.0.1:3", State: "up", MOP: admin.MOPStatus{ProbeError: "not shown: no MOP"}},
		}}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printStatus(&out, data); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	want := "http web1: memory probe failing (85 failures): poll memory 127.0.0.1:1: status 404[2J; MOP holds its allowed rate of 10.0/s until a probe answers (check metrics= and -mop-used-metric/-mop-max-metric)\n"
	if !strings.Contains(got, want) || strings.Contains(got, "web2:") || strings.Contains(got, "web3:") || strings.Contains(got, "\x1b") {
		t.Errorf("status:\n%s\nwant the line\n%s", got, want)
	}
}
