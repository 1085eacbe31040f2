package http

import (
	"bufio"
	"bytes"

	"fmt"
	"io"
	"net"
	nethttp "net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/lb"
)

// Request smuggling: the bytes a backend receives must parse, with a
// strict reference parser (net/http's ReadRequest), into exactly the
// requests the client sent, in order; or the client gets a refusal and
// nothing of the refused request reaches a backend. Every case runs on
// both engines, which must give the same answers.

// engines are the connection engines every smuggling case runs on, over
// plain HTTP and over HTTPS ("+tls": the same bytes in TLS records, each
// write of the client its own record).
var engines = []string{EngineLoop, EngineFastHTTP, EngineLoop + "+tls", EngineFastHTTP + "+tls"}

// seen is one request a recording backend read.
type seen struct {
	method, target, host, body string
	bad                        string // the backend could not read a request here
	incomplete                 bool   // its body was cut off (the connection closed)
}

// recorder is a backend that parses what it receives with net/http and
// answers each request with a body naming it, so a client can tell whose
// answer it got.
type recorder struct {
	ln  net.Listener
	mu  sync.Mutex
	log []seen
	wg  sync.WaitGroup
}

func startRecorder(t testing.TB) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	var conns sync.Map
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				defer c.Close()
				r.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		r.wg.Wait()
	})
	return r
}

func (r *recorder) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		if _, err := br.Peek(1); err != nil {
			return // closed between requests
		}
		req, err := nethttp.ReadRequest(br)
		if err != nil {
			r.add(seen{bad: err.Error()})
			return
		}
		body, err := io.ReadAll(req.Body)
		s := seen{method: req.Method, target: req.RequestURI, host: req.Host, body: string(body)}
		if err != nil {
			s.incomplete = true
			r.add(s)
			return
		}
		r.add(s)
		answer := "echo " + req.Method + " " + req.RequestURI + " " + string(body)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
	}
}

func (r *recorder) add(s seen) {
	r.mu.Lock()
	r.log = append(r.log, s)
	r.mu.Unlock()
}

func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.log)
}

func (r *recorder) since(m int) []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.log[m:]...)
}

// smuggleRig is a front end on engine with one recording backend.
func smuggleRig(t testing.TB, engine string, cfg Config) (*rig, *recorder) {
	t.Helper()
	rec := startRecorder(t)
	engine, secure := strings.CutSuffix(engine, "+tls")
	cfg.Engine = engine
	r := newRig(t, rigOpts{backends: 1, cfg: cfg, raw: func(net.Conn) {}, tls: secure})
	// Point the pool at the recorder instead of the raw backend.
	b, err := lb.NewBackend(lb.BackendConfig{ID: "rec", Addr: rec.ln.Addr().String(), Proto: "http"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := lb.NewPool(lb.PoolConfig{Passive: lb.PassiveConfig{MaxFails: 3, Cooldown: time.Minute}}, []*lb.Backend{b})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.srv.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	r.pool = pool
	return r, rec
}

// exchangeRaw writes raw (in pieces at the given split points), shuts the
// write side, and returns the answers read until the server closes or
// goes quiet.
func exchangeRaw(t testing.TB, addr string, raw []byte, splits []int) []*nethttp.Response {
	t.Helper()
	c, err := dialTest(addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	prev := 0
	for _, s := range splits {
		if s > prev && s < len(raw) {
			c.Write(raw[prev:s])
			prev = s
		}
	}
	c.Write(raw[prev:])
	closeWrite(c)
	var out []*nethttp.Response
	br := bufio.NewReader(c)
	for {
		resp, err := nethttp.ReadResponse(br, nil)
		if err != nil {
			return out
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		resp.Header.Set("X-Test-Body", string(b))
		out = append(out, resp)
	}
}

// reference parses raw as a strict server would: the requests in order,
// up to the first it cannot read.
func reference(raw []byte) []seen {
	br := bufio.NewReader(bytes.NewReader(raw))
	var out []seen
	for {
		if _, err := br.Peek(1); err != nil {
			return out
		}
		req, err := nethttp.ReadRequest(br)
		if err != nil {
			return out
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return out
		}
		out = append(out, seen{method: req.Method, target: req.RequestURI, host: req.Host, body: string(body)})
	}
}

// originTarget is the target sluice forwards for a client's target.
func originTarget(t string) string {
	if auth, rest, ok := splitAbsolute([]byte(t)); ok && len(auth) > 0 {
		return string(originForm(nil, rest))
	}
	return t
}

// checkDifferential asserts the smuggling property for one client stream:
// every complete request the backend read is the reference's request at
// the same position (method, target, body), and none was unreadable.
func checkDifferential(t testing.TB, raw []byte, got []seen) {
	t.Helper()
	want := reference(raw)
	i := 0
	for _, g := range got {
		if g.bad != "" {
			t.Fatalf("backend read bytes it could not parse (%s) from client stream %q", g.bad, raw)
		}
		if g.incomplete {
			continue // a streamed body cut off by a refusal: the backend connection was closed
		}
		if i >= len(want) {
			t.Fatalf("backend got request %d (%s %s body %q) that a strict parser does not see in %q", i, g.method, g.target, g.body, raw)
		}
		w := want[i]
		if g.method != w.method || g.target != originTarget(w.target) || g.body != w.body {
			t.Fatalf("backend request %d is %s %s body %q; the client sent %s %s body %q (stream %q)", i, g.method, g.target, g.body, w.method, w.target, w.body, raw)
		}
		i++
	}
}

// smuggleCases: a client stream, then either the requests the backend
// must get (with the answers' statuses) or the refusal status after the
// requests before it.
var smuggleCases = []struct {
	name    string
	raw     string
	forward []string // "METHOD target body" the backend must get, in order
	refuse  int      // status of the last answer; 0: every answer is 200
	host    string   // Host the backend must see for the first request ("" = any, "listener" = the address the client connected to)
}{
	{"plain", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", []string{"GET / "}, 0, "x"},
	{"pipelined three", "GET /1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /3 HTTP/1.1\r\nHost: x\r\n\r\n", []string{"GET /1 ", "POST /2 hello", "GET /3 "}, 0, ""},
	{"Connection: Content-Length smuggles", "POST / HTTP/1.1\r\nHost: x\r\nConnection: Content-Length\r\nContent-Length: 36\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", nil, 400, ""},
	{"Connection: Content-Length large body", "POST / HTTP/1.1\r\nHost: x\r\nConnection: Content-Length\r\nContent-Length: 70000\r\n\r\n" + strings.Repeat("a", 70000), nil, 400, ""},
	{"Connection: Transfer-Encoding", "POST / HTTP/1.1\r\nHost: x\r\nConnection: transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", nil, 400, ""},
	{"after a good request", "GET /ok HTTP/1.1\r\nHost: x\r\n\r\nPOST / HTTP/1.1\r\nHost: x\r\nConnection: Content-Length\r\nContent-Length: 36\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", []string{"GET /ok "}, 400, ""},
	{"CL.TE", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG", nil, 400, ""},
	{"TE.CL", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n", nil, 400, ""},
	{"two CL", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 36\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", nil, 400, ""},
	{"TE chunked, identity", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n", nil, 400, ""},
	{"TE obs-fold", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", nil, 400, ""},
	{"TE odd case", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ChUnKeD\r\n\r\n5\r\nhello\r\n0\r\n\r\n", []string{"POST / hello"}, 0, ""},
	{"chunked then pipelined", "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n", []string{"POST /c hello", "GET /after "}, 0, ""},
	{"chunked trailer field", "POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nForwarded: for=6.6.6.6\r\n\r\n", nil, 400, ""},
	{"chunk size overflow", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\nhello\r\n0\r\n\r\n", nil, 400, ""},
	{"chunk bare LF", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", nil, 400, ""},
	{"space before colon", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length : 36\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", nil, 400, ""},
	{"space in name", "GET / HTTP/1.1\r\nHost: x\r\nX A: c\r\n\r\n", nil, 400, ""},
	{"bare LF mixed", "GET / HTTP/1.1\r\nHost: x\nContent-Length: 36\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", nil, 400, ""},
	{"bare LF only", "GET / HTTP/1.1\nHost: x\n\n", nil, 400, ""},
	{"CRLF LF end then pipelined", "GET / HTTP/1.1\r\nHost: x\r\n\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n", nil, 400, ""},
	{"bare CR", "GET / HTTP/1.1\r\nHost: x\rContent-Length: 5\r\n\r\n", nil, 400, ""},
	{"NUL in value", "GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", nil, 400, ""},
	{"control in name", "GET / HTTP/1.1\r\nHost: x\r\nX\x01: b\r\n\r\n", nil, 400, ""},
	{"absolute-form", "GET http://other.example/p?q HTTP/1.1\r\nHost: x\r\n\r\n", []string{"GET /p?q "}, 0, "other.example"},
	{"empty first segment", "GET //api/h HTTP/1.1\r\nHost: x\r\n\r\n", []string{"GET //api/h "}, 0, "x"},
	{"absolute-form empty first segment", "GET http://a.example//api/h HTTP/1.1\r\nHost: x\r\n\r\n", []string{"GET //api/h "}, 0, "a.example"},
	{"absolute-form no path", "GET http://other.example HTTP/1.1\r\nHost: x\r\n\r\n", []string{"GET / "}, 0, "other.example"},
	{"absolute-form userinfo", "GET http://user:pw@other.example/ HTTP/1.1\r\nHost: x\r\n\r\n", nil, 400, ""},
	{"asterisk OPTIONS", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", []string{"OPTIONS * "}, 0, ""},
	{"asterisk GET", "GET * HTTP/1.1\r\nHost: x\r\n\r\n", nil, 400, ""},
	{"CONNECT", "CONNECT other.example:443 HTTP/1.1\r\nHost: other.example:443\r\n\r\n", nil, 501, ""},
	{"HTTP/1.0 without Host", "GET /old HTTP/1.0\r\n\r\n", []string{"GET /old "}, 0, "listener"},
	{"empty Host", "GET /e HTTP/1.1\r\nHost:\r\n\r\n", nil, 400, ""},
	{"1.1 without Host", "GET / HTTP/1.1\r\n\r\n", nil, 400, ""},
	{"two Host", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", nil, 400, ""},
	{"Host port junk", "GET / HTTP/1.1\r\nHost: a:80x\r\n\r\n", nil, 400, ""},
	{"Host two ports", "GET / HTTP/1.1\r\nHost: a:80:90\r\n\r\n", nil, 400, ""},
	{"Host open bracket", "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", nil, 400, ""},
	{"Host percent", "GET / HTTP/1.1\r\nHost: a%2fb\r\n\r\n", nil, 400, ""},
	{"Host empty port", "GET / HTTP/1.1\r\nHost: a:\r\n\r\n", nil, 400, ""},
	{"Host IPv6 and port", "GET /v6 HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", []string{"GET /v6 "}, 0, "[::1]:8080"},
	{"Host name and port", "GET /np HTTP/1.1\r\nHost: shop.example:8080\r\n\r\n", []string{"GET /np "}, 0, "shop.example:8080"},
	{"HTTP/2.0 line", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", nil, 505, ""},
	{"target over 16 KiB", "GET /" + strings.Repeat("a", 17<<10) + " HTTP/1.1\r\nHost: x\r\n\r\n", nil, 414, ""},
	{"target of 1 MiB", "GET /?q=" + strings.Repeat("a", 1<<20) + " HTTP/1.1\r\nHost: x\r\n\r\n", nil, 414, ""},
	{"header of 1 MiB", "GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("a", 1<<20) + "\r\n\r\n", nil, 431, ""},
	{"line of 17 KiB without a space", strings.Repeat("G", 17<<10) + "\r\n\r\n", nil, 400, ""},
	{"head over 16 KiB", "GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("a", 17<<10) + "\r\n\r\n", nil, 431, ""},
	{"many headers", "GET / HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X-A: b\r\n", 250) + "\r\n", nil, 431, ""},
}

// TestSmuggling runs every case on both engines: the answers' statuses,
// the requests the backend got, and the differential property.
func TestSmuggling(t *testing.T) {
	answers := map[string][]string{}
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			r, rec := smuggleRig(t, engine, Config{StickyCookie: "-"})
			for _, tc := range smuggleCases {
				m := rec.mark()
				resps := exchangeRaw(t, r.addr, []byte(tc.raw), nil)
				got := rec.since(m)
				var statuses []string
				for _, resp := range resps {
					statuses = append(statuses, fmt.Sprint(resp.StatusCode))
				}
				answers[tc.name] = append(answers[tc.name], strings.Join(statuses, ","))
				want := len(tc.forward)
				if tc.refuse != 0 {
					want++
				}
				if len(resps) != want {
					t.Errorf("%s: %d answers %v, want %d", tc.name, len(resps), statuses, want)
					continue
				}
				for i, f := range tc.forward {
					if resps[i].StatusCode != 200 || resps[i].Header.Get("X-Test-Body") != "echo "+f {
						t.Errorf("%s: answer %d is %d %q, want 200 %q", tc.name, i, resps[i].StatusCode, resps[i].Header.Get("X-Test-Body"), "echo "+f)
					}
				}
				if tc.refuse != 0 {
					last := resps[len(resps)-1]
					if last.StatusCode != tc.refuse || !last.Close {
						t.Errorf("%s: last answer %d close=%v, want %d and the connection closed", tc.name, last.StatusCode, last.Close, tc.refuse)
					}
				}
				var complete []seen
				for _, g := range got {
					if !g.incomplete {
						complete = append(complete, g)
					}
				}
				if len(complete) != len(tc.forward) {
					t.Errorf("%s: backend got %d requests %+v, want %d", tc.name, len(complete), complete, len(tc.forward))
					continue
				}
				for i, f := range tc.forward {
					if g := complete[i]; g.method+" "+g.target+" "+g.body != f {
						t.Errorf("%s: backend request %d is %q, want %q", tc.name, i, g.method+" "+g.target+" "+g.body, f)
					}
				}
				switch {
				case tc.host == "listener" && len(complete) > 0 && complete[0].host != r.addr:
					t.Errorf("%s: backend saw Host %q, want the address the client connected to, %s (never the backend's own)", tc.name, complete[0].host, r.addr)
				case tc.host != "" && tc.host != "listener" && len(complete) > 0 && complete[0].host != tc.host:
					t.Errorf("%s: backend saw Host %q, want %q", tc.name, complete[0].host, tc.host)
				}
				checkDifferential(t, []byte(tc.raw), got)
			}
			// What one client sent counted against no backend.
			if b := r.pool.Backends()[0]; !b.AcceptsNew(r.clock.Now()) {
				t.Errorf("the backend was ejected by client errors")
			}
		})
	}
	if t.Failed() {
		return
	}
	for name, a := range answers {
		for i := range a {
			if a[i] != a[0] {
				t.Errorf("%s: the engines answer differently: %s %s, %s %s", name, engines[0], a[0], engines[i], a[i])
			}
		}
	}
}

// TestSmugglingSplitAnywhere: the same streams written in two pieces at
// every split point of the first 200 bytes give the same answers (a head
// that straddles reads is read the same).
func TestSmugglingSplitAnywhere(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			r, rec := smuggleRig(t, engine, Config{StickyCookie: "-"})
			for _, name := range []string{"pipelined three", "Connection: Content-Length smuggles", "chunked then pipelined", "CRLF LF end then pipelined"} {
				var raw string
				for _, tc := range smuggleCases {
					if tc.name == name {
						raw = tc.raw
					}
				}
				whole := len(exchangeRaw(t, r.addr, []byte(raw), nil))
				for at := 1; at < min(len(raw), 200); at += 7 {
					m := rec.mark()
					resps := exchangeRaw(t, r.addr, []byte(raw), []int{at})
					if len(resps) != whole {
						t.Errorf("%s split at %d: %d answers, want %d", name, at, len(resps), whole)
					}
					checkDifferential(t, []byte(raw), rec.since(m))
				}
			}
		})
	}
}

// TestSmugglingAttackerVictim: an attacker and a victim share the one
// backend connection (-http-backend-max-conns 1). The attacker's request
// hiding a second one behind Connection: Content-Length is refused; the
// victim always gets the answer to its own request.
func TestSmugglingAttackerVictim(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			r, rec := smuggleRig(t, engine, Config{StickyCookie: "-", MaxConns: 1})
			attack := "POST / HTTP/1.1\r\nHost: x\r\nConnection: Content-Length\r\nContent-Length: 36\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
			victim := dialRaw(t, r.addr)
			for i := range 10 {
				resps := exchangeRaw(t, r.addr, []byte(attack), nil)
				if len(resps) != 1 || resps[0].StatusCode != 400 {
					t.Fatalf("round %d: attacker got %d answers, want one 400", i, len(resps))
				}
				path := fmt.Sprintf("/victim/%d", i)
				victim.send("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")
				resp, body := victim.read("GET")
				if resp.StatusCode != 200 || body != "echo GET "+path+" " {
					t.Fatalf("round %d: victim got %d %q, want its own answer", i, resp.StatusCode, body)
				}
			}
			for _, g := range rec.since(0) {
				if strings.Contains(g.target, "smuggled") || g.bad != "" {
					t.Fatalf("backend got %+v", g)
				}
			}
		})
	}
}

// TestClientErrorsDoNotEject: requests a client gets wrong, however many,
// never count as the backend's failures; other clients keep being served.
func TestClientErrorsDoNotEject(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			r, _ := smuggleRig(t, engine, Config{StickyCookie: "-"})
			bad := []string{
				"GET / HTTP/1.0\r\n\r\n", // valid: forwarded with the backend's Host
				"POST / HTTP/1.1\r\nHost: x\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello",
				"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nshort", // body never completes
				"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                             // client leaves before the answer
			}
			for range 6 {
				for _, raw := range bad {
					c, err := net.Dial("tcp", r.addr)
					if err != nil {
						t.Fatal(err)
					}
					io.WriteString(c, raw)
					closeWrite(c)
					c.SetReadDeadline(time.Now().Add(2 * time.Second))
					io.Copy(io.Discard, c)
					c.Close()
				}
			}
			for i := range 10 {
				if rep := r.get(fmt.Sprintf("/ok/%d", i), ""); rep.status != 200 {
					t.Fatalf("ordinary request %d: %d %q", i, rep.status, rep.body)
				}
			}
		})
	}
}

// FuzzSmuggling feeds request streams, split at a point the fuzzer picks,
// through both engines and asserts the differential property: what the
// backend reads is a prefix of what a strict parser reads from the
// client's bytes, request by request.
func FuzzSmuggling(f *testing.F) {
	for _, tc := range smuggleCases {
		if len(tc.raw) < 4096 {
			f.Add([]byte(tc.raw), uint16(len(tc.raw)/2))
		}
	}
	rigs := map[string]*rig{}
	recs := map[string]*recorder{}
	for _, engine := range engines {
		rigs[engine], recs[engine] = smuggleRig(f, engine, Config{StickyCookie: "-", ClientReadTimeout: time.Second})
	}
	f.Fuzz(func(t *testing.T, raw []byte, split uint16) {
		if len(raw) > 8<<10 {
			return
		}
		for _, engine := range engines {
			m := recs[engine].mark()
			exchangeRaw(t, rigs[engine].addr, raw, []int{int(split)})
			checkDifferential(t, raw, recs[engine].since(m))
		}
	})
}

// TestAbortedUploadDoesNotEject: clients that leave in the middle of a
// large upload (streamed to the backend as it arrives) are the clients'
// failures: repeated past the passive-ejection threshold, they leave the
// backend up for everyone else.
func TestAbortedUploadDoesNotEject(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			r, _ := smuggleRig(t, engine, Config{StickyCookie: "-"})
			for range 5 {
				c, err := dialTest(r.addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n"+strings.Repeat("a", 100000))
				time.Sleep(100 * time.Millisecond) // part of the body reaches the backend
				c.Close()

			}
			time.Sleep(200 * time.Millisecond)
			for i := range 5 {
				if rep := r.get(fmt.Sprintf("/after/%d", i), ""); rep.status != 200 {
					t.Fatalf("request %d after the aborted uploads: %d %q", i, rep.status, rep.body)
				}
			}
		})
	}
}
