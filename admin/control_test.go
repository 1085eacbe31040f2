package admin

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

type fakeConfig string

func (f fakeConfig) RunningConfig() string { return string(f) }

// controlRig is an admin server over an HTTP pool (b1 with MOP, b2
// without) and a controller with one rule, recording events.
type controlRig struct {
	srv    *Server
	pool   *lb.Pool
	ctrl   *admission.Controller
	mu     sync.Mutex
	events []admission.Event
}

func newControlRig(t *testing.T) *controlRig {
	t.Helper()
	mop, err := admission.NewMOP(admission.MOPConfig{Name: "http b1", InitialRate: 10})
	if err != nil {
		t.Fatal(err)
	}
	b1, _ := lb.NewBackend(lb.BackendConfig{ID: "b1", Addr: "127.0.0.1:10001", Proto: "http", MOP: mop})
	b2, _ := lb.NewBackend(lb.BackendConfig{ID: "b2", Addr: "127.0.0.1:10002", Proto: "http"})
	pool, err := lb.NewPool(lb.PoolConfig{}, []*lb.Backend{b1, b2})
	if err != nil {
		t.Fatal(err)
	}
	rule, _ := admission.ParseRule("name=invites,proto=sip,limit=100/s")
	ctrl, err := admission.NewController(admission.ControllerConfig{Rules: []admission.RuleConfig{rule}}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := &controlRig{srv: New(nil), pool: pool, ctrl: ctrl}
	RegisterControl(r.srv, ControlConfig{
		Operator: Operators{
			TargetBackend: PoolControl(func() []*lb.Pool { return []*lb.Pool{pool} }),
			TargetARM:     RuleControl{Controller: ctrl, Now: func() int64 { return 0 }},
		},
		Config: fakeConfig("arm name=invites,proto=sip,limit=100/s\n"),
		Events: func(e admission.Event) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() },
	})
	return r
}

func (r *controlRig) do(method, path, value string, hdr map[string]string) *httptest.ResponseRecorder {
	var body *strings.Reader
	if value != "" {
		body = strings.NewReader(url.Values{"value": {value}}.Encode())
	} else {
		body = strings.NewReader("")
	}
	req := httptest.NewRequest(method, path, body)
	req.RemoteAddr = "192.0.2.7:4321"
	if value != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	r.srv.Handler().ServeHTTP(rec, onLoopback(req))
	return rec
}

func TestControlTable(t *testing.T) {
	r := newControlRig(t)
	b1, b2 := r.pool.Lookup("b1"), r.pool.Lookup("b2")
	rule := func() admission.RuleConfig { rc, _ := r.ctrl.Rule("invites"); return rc }
	for _, tc := range []struct {
		name, method, path, value string
		code                      int
		body                      string // in the answer
		check                     func() bool
	}{
		{"disable", "POST", "/control/backends/b2/disable", "", 200, "disabled false -> true", func() bool { return b2.State(0) == lb.Down }},
		{"enable", "POST", "/control/backends/b2/enable", "", 200, "disabled true -> false", func() bool { return b2.State(0) == lb.Up }},
		{"GET disable", "GET", "/control/backends/b2/disable", "", 405, "", func() bool { return b2.State(0) == lb.Up }},
		{"pin", "POST", "/control/backends/b1/mop/pin", "500", 200, "pinned at 500/s", func() bool { return b1.MOP().Pinned() == 500 }},
		{"pin /s", "POST", "/control/backends/b1/mop/pin", "400/s", 200, "pinned at 400/s", func() bool { return b1.MOP().Pinned() == 400 }},
		{"pin bad", "POST", "/control/backends/b1/mop/pin", "fast", 400, "want requests per second", func() bool { return b1.MOP().Pinned() == 400 }},
		{"pin no value", "POST", "/control/backends/b1/mop/pin", "", 400, "rate", nil},
		{"pin without MOP", "POST", "/control/backends/b2/mop/pin", "5", 409, "no memory probe", nil},
		{"GET pin", "GET", "/control/backends/b1/mop/pin", "", 405, "", nil},
		{"unpin", "POST", "/control/backends/b1/mop/unpin", "", 200, "learning", func() bool { return b1.MOP().Pinned() == 0 }},
		{"unpin again", "POST", "/control/backends/b1/mop/unpin", "", 409, "not pinned", nil},
		{"reset", "POST", "/control/backends/b1/mop/reset", "", 200, "discovery", func() bool { return b1.MOP().Status().Phase == admission.Discovery }},
		{"unknown backend action", "POST", "/control/backends/b1/explode", "", 404, "", nil},
		{"unknown backend", "POST", "/control/backends/b9/drain", "", 404, "no such backend", nil},
		{"arm set", "POST", "/control/arm/invites/set", "limit=500/s,action=reject", 200, "limit=100/s -> name=invites,proto=sip,limit=500/s,action=reject",
			func() bool { return rule().Limit == 500 && rule().Action == admission.ActionReject }},
		{"arm set bad limit", "POST", "/control/arm/invites/set", "limit=lots", 400, "limit", func() bool { return rule().Limit == 500 }},
		{"arm set rename", "POST", "/control/arm/invites/set", "name=x", 400, "name cannot change", nil},
		{"arm set empty", "POST", "/control/arm/invites/set", "", 400, "no change", nil},
		{"arm set unknown", "POST", "/control/arm/nope/set", "limit=1/s", 404, "no such arm rule", nil},
		{"GET arm set", "GET", "/control/arm/invites/set", "", 405, "", nil},
		{"arm add", "POST", "/control/arm/add", "name=api,proto=http,path=/api/,limit=5/s", 200, "added name=api", func() bool { _, ok := r.ctrl.Rule("api"); return ok }},
		{"arm add again", "POST", "/control/arm/add", "name=api,limit=9/s", 409, "already exists", nil},
		{"arm add bad", "POST", "/control/arm/add", "name=x", 400, "limit is required", nil},
		{"GET arm add", "GET", "/control/arm/add", "", 405, "", nil},
		{"arm remove", "POST", "/control/arm/api/remove", "", 200, "removed name=api", func() bool { _, ok := r.ctrl.Rule("api"); return !ok }},
		{"arm remove unknown", "POST", "/control/arm/api/remove", "", 404, "no such arm rule", nil},
		{"config", "GET", "/control/config", "", 200, "arm name=invites", nil},
		{"POST config", "POST", "/control/config", "", 405, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := r.do(tc.method, tc.path, tc.value, nil)
			if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.body) {
				t.Errorf("%s %s value=%q = %d %q, want %d with %q", tc.method, tc.path, tc.value, rec.Code, rec.Body.String(), tc.code, tc.body)
			}
			if tc.check != nil && !tc.check() {
				t.Errorf("%s %s: not in the expected state", tc.method, tc.path)
			}
		})
	}
	// The changes made are in the event log, with who asked and what changed.
	r.mu.Lock()
	defer r.mu.Unlock()
	var arm, backend int
	for _, e := range r.events {
		if !strings.Contains(e.Message, "192.0.2.7:4321") {
			t.Errorf("event without the caller: %+v", e)
		}
		switch e.Kind {
		case EventControl:
			arm++
		case admission.EventBackendState:
			backend++
		}
	}
	if arm != 3 || backend != 6 {
		t.Errorf("%d arm and %d backend events, want 3 and 6: %+v", arm, backend, r.events)
	}
	if m := r.events[len(r.events)-1].Message; !strings.Contains(m, "arm rule api remove") || !strings.Contains(m, "removed name=api") {
		t.Errorf("last event %q", m)
	}
}

const tokenFile = `# admin tokens
ops   0123456789abcdef0123
robot fedcba9876543210fedc
`

func TestTokens(t *testing.T) {
	r := newControlRig(t)
	tokens, err := ParseTokens("tokens", []byte(tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	r.srv.RequireTokens(tokens)
	for _, tc := range []struct {
		name, method, path, auth string
		code                     int
	}{
		{"no token", "POST", "/control/backends/b2/disable", "", 401},
		{"not bearer", "POST", "/control/backends/b2/disable", "Basic b3BzOng=", 401},
		{"empty bearer", "POST", "/control/backends/b2/disable", "Bearer ", 401},
		{"wrong token", "POST", "/control/backends/b2/disable", "Bearer 0123456789abcdef0124", 403},
		{"prefix of a token", "POST", "/control/backends/b2/disable", "Bearer 0123456789abcdef", 403},
		{"status needs one too", "GET", "/control/config", "", 401},
		{"healthz stays open", "GET", "/healthz", "", 404}, // not mounted on this rig: past the check
		{"second token", "POST", "/control/backends/b2/disable", "Bearer fedcba9876543210fedc", 200},
		{"first token", "POST", "/control/backends/b2/enable", "bearer 0123456789abcdef0123", 200},
	} {
		hdr := map[string]string{}
		if tc.auth != "" {
			hdr["Authorization"] = tc.auth
		}
		rec := r.do(tc.method, tc.path, "", hdr)
		if rec.Code != tc.code {
			t.Errorf("%s: %d %q, want %d", tc.name, rec.Code, rec.Body.String(), tc.code)
		}
		if tc.code == 401 && rec.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", tc.name)
		}
	}
	if b2 := r.pool.Lookup("b2"); b2.State(0) != lb.Up {
		t.Errorf("b2 is %v after disable and enable by token", b2.State(0))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) != 2 || !strings.Contains(r.events[0].Message, "192.0.2.7:4321 token robot") || !strings.Contains(r.events[1].Message, "token ops") {
		t.Errorf("events do not name the token: %+v", r.events)
	}
}

// TestTokenCompareConstantTime: every token is compared with
// subtle.ConstantTimeCompare, whichever matches, so the answer's timing
// does not tell which token matched or how much of one.
func TestTokenCompareConstantTime(t *testing.T) {
	tokens, err := ParseTokens("tokens", []byte(tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	var lens []int
	orig := constantTimeCompare
	constantTimeCompare = func(a, b []byte) int { calls++; lens = append(lens, len(a), len(b)); return orig(a, b) }
	defer func() { constantTimeCompare = orig }()
	for _, tc := range []struct {
		presented, name string
		ok              bool
	}{
		{"0123456789abcdef0123", "ops", true},
		{"fedcba9876543210fedc", "robot", true},
		{"x", "", false},
		{strings.Repeat("0", 200), "", false},
	} {
		calls, lens = 0, nil
		name, ok := tokens.Check(tc.presented)
		if name != tc.name || ok != tc.ok {
			t.Errorf("Check(%q) = %q %v", tc.presented, name, ok)
		}
		if calls != tokens.Len() {
			t.Errorf("Check(%q) compared %d tokens, want all %d", tc.presented, calls, tokens.Len())
		}
		for _, l := range lens {
			if l != 32 {
				t.Errorf("Check(%q) compared %d bytes: compare fixed-length digests, not the tokens", tc.presented, l)
			}
		}
	}
}

func TestParseTokens(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{"0123456789abcdef0123\n", ""},
		{"# only a comment\n\n", "no token"},
		{"ops short\n", "tokens:1: token \"ops\" is shorter than 16"},
		{"a 0123456789abcdef0123\na fedcba9876543210fedc\n", "tokens:2: token name \"a\" given twice"},
		{"a b c\n", "tokens:1: want NAME TOKEN"},
	} {
		tk, err := ParseTokens("tokens", []byte(tc.in))
		if tc.err == "" {
			if err != nil || tk.Len() != 1 {
				t.Errorf("ParseTokens(%q): %v", tc.in, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "-admin-token-file") {
			t.Errorf("ParseTokens(%q) = %v, want an error with %q naming -admin-token-file", tc.in, err, tc.err)
		}
	}
}

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr, tokens string
		ok           bool
	}{
		{"127.0.0.1:9090", "", true},
		{"127.0.0.9:9090", "", true},
		{"[::1]:9090", "", true},
		{"localhost:9090", "", true},
		{"", "", true},
		{"0.0.0.0:9090", "", false},
		{":9090", "", false},
		{"192.0.2.1:9090", "", false},
		{"example.com:9090", "", false},
		{"0.0.0.0:9090", "/etc/sluice/tokens", true},
	} {
		err := CheckListen(tc.addr, tc.tokens)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, %q) = %v", tc.addr, tc.tokens, err)
		}
		if err != nil && (!strings.Contains(err.Error(), "-admin-listen") || !strings.Contains(err.Error(), "-admin-token-file")) {
			t.Errorf("error %q does not name both flags", err)
		}
	}
}

// TestTokensOverTheListener runs the check on a real loopback listener.
func TestTokensOverTheListener(t *testing.T) {
	r := newControlRig(t)
	tokens, _ := ParseTokens("tokens", []byte(tokenFile))
	r.srv.RequireTokens(tokens)
	ln, err := newLocalListener()
	if err != nil {
		t.Fatal(err)
	}
	go r.srv.Serve(ln)
	defer func() {
		ctx, cancel := contextWithTimeout(5e9)
		defer cancel()
		r.srv.Shutdown(ctx)
	}()
	req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/control/backends/b1/drain", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("without a token: %d", resp.StatusCode)
	}
	req.Header.Set("Authorization", "Bearer 0123456789abcdef0123")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || r.pool.Lookup("b1").State(0) != lb.Draining {
		t.Errorf("with a token: %d, b1 %v", resp.StatusCode, r.pool.Lookup("b1").State(0))
	}
}

// TestLoadTokensBounded: -admin-token-file is read only as a regular file
// of at most 4 MiB; a FIFO does not hang start-up.
func TestLoadTokensBounded(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "tokens")
	os.WriteFile(big, []byte(strings.Repeat("# padding\n", 4<<20/10+1)+"ops 0123456789abcdef0123\n"), 0o600)
	for _, c := range []struct{ path, want string }{
		{big, "more than 4 MiB"},
		{fifo, "not a regular file"},
	} {
		done := make(chan error, 1)
		go func() { _, err := LoadTokens(c.path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.HasPrefix(err.Error(), "-admin-token-file: ") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("-admin-token-file %s: %v, want an error naming the flag with %q", c.path, err, c.want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("-admin-token-file %s: LoadTokens does not return", c.path)
		}
	}
}
