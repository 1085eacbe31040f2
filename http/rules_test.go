package http

import (
	"strings"
	"testing"

	"github.com/sluicelb/sluice/admission"
)

// TestRuleChangesReachRequests: the ARM rules change at run time; a path
// rule added after the front end started matches the next request's path,
// and refusals name the rule in force, on both engines.
func TestRuleChangesReachRequests(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, arm: []string{"name=hosts,host=example.invalid,limit=1/min,action=reject"}})
		add := func(spec string) {
			t.Helper()
			rc, err := admission.ParseRule(spec)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.ctrl.AddRule(rc, r.clock.Now()); err != nil {
				t.Fatal(err)
			}
		}
		for range 3 {
			if rep := r.get("/api/x", ""); rep.status != 200 {
				t.Fatalf("before any path rule: %d", rep.status)
			}
		}
		add("name=api,path=/api/,limit=1/min,action=reject")
		if rep := r.get("/api/x", ""); rep.status != 200 {
			t.Fatalf("first request under the new rule: %d", rep.status)
		}
		rep := r.get("/api/y", "")
		if rep.status != 429 || !strings.Contains(rep.header.Get("Proxy-Status"), `"arm rule api"`) {
			t.Errorf("second request under the new path rule: %d %q, want 429 naming arm rule api", rep.status, rep.header.Get("Proxy-Status"))
		}
		if rep := r.get("/other", ""); rep.status != 200 {
			t.Errorf("a path the rule does not match: %d", rep.status)
		}
		// The first rule goes: api is now rule 0, and a new rule 1 matches
		// another path; refusals name each by its new index.
		if _, err := r.ctrl.RemoveRule("hosts", r.clock.Now()); err != nil {
			t.Fatal(err)
		}
		add("name=docs,path=/docs/,limit=1/min,action=reject")
		r.get("/docs/a", "")
		for path, rule := range map[string]string{"/api/z": "api", "/docs/b": "docs"} {
			rep := r.get(path, "")
			if rep.status != 429 || !strings.Contains(rep.header.Get("Proxy-Status"), `"arm rule `+rule+`"`) {
				t.Errorf("%s: %d %q, want 429 naming arm rule %s", path, rep.status, rep.header.Get("Proxy-Status"), rule)
			}
		}
	})
}

// ruleSpellings is the golden table of the normalised view: a request
// target and Host as a client may spell them, the host and path rules
// match on (matchHost, matchPath), and which rule of rulesForSpellings the
// request falls under ("" = none). Each row is sent through both engines
// too (TestRuleSpellingsOnEngines).
var ruleSpellings = []struct {
	target, host string
	wantPath     string
	wantHost     string
	rule         string
}{
	// the plain spellings
	{"/api/h", "other.example", "/api/h", "other.example", "api"},
	{"/api/", "other.example", "/api/", "other.example", "api"},
	{"/api", "other.example", "/api", "other.example", ""},
	{"/apix/h", "other.example", "/apix/h", "other.example", ""},
	{"/", "shop.example", "/", "shop.example", "shop"},
	{"/other?x=/api/", "other.example", "/other", "other.example", ""},
	{"/api/h?q=1", "other.example", "/api/h", "other.example", "api"},
	// empty segments: an origin-form target is a path, never an authority
	{"//api/h", "other.example", "/api/h", "other.example", "api"},
	{"///api//h", "other.example", "/api/h", "other.example", "api"},
	{"/api//", "other.example", "/api/", "other.example", "api"},
	// path parameters, as the Java servers behind MOP cut them
	{"/api;x/e", "other.example", "/api/e", "other.example", "api"},
	{"/api;jsessionid=1/e;v=2", "other.example", "/api/e", "other.example", "api"},
	{"/;x/api/h", "other.example", "/api/h", "other.example", "api"},
	{"/api%3bx/k", "other.example", "/api/k", "other.example", "api"},
	{"/api%3Bx/k", "other.example", "/api/k", "other.example", "api"},
	// percent-encoding, decoded once
	{"/%61pi/h", "other.example", "/api/h", "other.example", "api"},
	{"/%41pi/h", "other.example", "/Api/h", "other.example", ""},
	{"/api%2fh", "other.example", "/api/h", "other.example", "api"},
	{"/%2561pi/h", "other.example", "/%61pi/h", "other.example", ""},
	{"/a%20b", "other.example", "/a b", "other.example", ""},
	// dot-segments, after the parameters
	{"/x/../api/h", "other.example", "/api/h", "other.example", "api"},
	{"/./api/h", "other.example", "/api/h", "other.example", "api"},
	{"/x/..;/api/h", "other.example", "/api/h", "other.example", "api"},
	{"/x/%2e%2e/api/h", "other.example", "/api/h", "other.example", "api"},
	{"/../../api/h", "other.example", "/api/h", "other.example", "api"},
	{"/api/x/..", "other.example", "/api/", "other.example", "api"},
	{"/api/.", "other.example", "/api/", "other.example", "api"},
	{"/api/x/../../other", "other.example", "/other", "other.example", ""},
	{"/api.x/h", "other.example", "/api.x/h", "other.example", ""},
	{"/api/..x", "other.example", "/api/..x", "other.example", "api"},
	// backslash
	{`/api\h`, "other.example", "/api/h", "other.example", "api"},
	{"/api%5ch", "other.example", "/api/h", "other.example", "api"},
	// absolute-form: the authority is the host
	{"http://SHOP.example./p", "ignored.example", "/p", "shop.example", "shop"},
	{"http://other.example//api/h", "ignored.example", "/api/h", "other.example", "api"},
	// host spellings
	{"/p", "shop.example.", "/p", "shop.example", "shop"},
	{"/p", "shop.example:80", "/p", "shop.example", "shop"},
	{"/p", "SHOP.example:0080", "/p", "shop.example", "shop"},
	{"/p", "shop.example:8080", "/p", "shop.example", "shop"},
	{"/p", "Shop.Example..:443", "/p", "shop.example", "shop"},
	{"/p", "shop.example.other", "/p", "shop.example.other", ""},
	{"/p", "[::1]:80", "/p", "[::1]", ""},
	{"/p", "[ABCD::1]", "/p", "[abcd::1]", ""},
	{"*", "other.example", "*", "other.example", ""},
}

// rulesForSpellings are the rules the table refers to; the earlier rule
// is the one a request falls under first.
var rulesForSpellings = []string{
	"name=api,path=/api/,limit=1/min,action=reject",
	"name=shop,host=shop.example,limit=1/min,action=reject",
}

func TestMatchPathAndHost(t *testing.T) {
	for _, tc := range ruleSpellings {
		target := tc.target
		host := tc.host
		if auth, rest, ok := splitAbsolute([]byte(target)); ok {
			host, target = string(auth), string(originForm(nil, rest))
		}
		if got := string(matchPath(nil, []byte(target))); got != tc.wantPath {
			t.Errorf("matchPath(%q) = %q, want %q", tc.target, got, tc.wantPath)
		}
		if got := string(matchHost(nil, []byte(host))); got != tc.wantHost {
			t.Errorf("matchHost(%q) = %q, want %q", tc.host, got, tc.wantHost)
		}
		// The normal form is a fixed point (but for a '%' that decoding
		// once made: it is decoded once, as servers do).
		if again := string(matchPath(nil, []byte(tc.wantPath))); again != tc.wantPath && !strings.Contains(tc.wantPath, "%") {
			t.Errorf("matchPath(%q) = %q: not a fixed point", tc.wantPath, again)
		}
	}
}

// TestMatchPathNoAlloc: a path already in normal form is matched where it
// is.
func TestMatchPathNoAlloc(t *testing.T) {
	p := []byte("/api/v1/items/42?x=1")
	h := []byte("shop.example:8080")
	if n := testing.AllocsPerRun(100, func() { matchPath(nil, p); matchHost(nil, h) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

// TestRuleSpellingsOnEngines: with the api and shop rules at their limits,
// every spelling of the table that falls under a rule is refused by that
// rule, and the others are served, alike on both engines.
func TestRuleSpellingsOnEngines(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, arm: rulesForSpellings})
		// Use up both rules.
		for _, raw := range []string{
			"GET /api/used HTTP/1.1\r\nHost: other.example\r\n\r\n",
			"GET /used HTTP/1.1\r\nHost: shop.example\r\n\r\n",
		} {
			if got := rawRoundTrip(t, r.addr, raw); !strings.HasPrefix(got, "200\n") {
				t.Fatalf("%q: %q", raw, got)
			}
		}
		for _, tc := range ruleSpellings {
			method := "GET"
			if tc.target == "*" {
				method = "OPTIONS"
			}
			raw := method + " " + tc.target + " HTTP/1.1\r\nHost: " + tc.host + "\r\n\r\n"
			got := rawRoundTrip(t, r.addr, raw)
			switch {
			case tc.rule == "" && !strings.HasPrefix(got, "200\n"):
				t.Errorf("%s %s Host %s: want 200 (no rule), got %.60q", method, tc.target, tc.host, got)
			case tc.rule != "" && !(strings.HasPrefix(got, "429\n") && strings.Contains(got, `"arm rule `+tc.rule+`"`)):
				t.Errorf("%s %s Host %s: want 429 by rule %s, got %.60q", method, tc.target, tc.host, tc.rule, got)
			}
		}
	})
}

func BenchmarkMatchPath(b *testing.B) {
	b.ReportAllocs()
	normal := []byte("/api/v1/items/42?x=1")
	odd := []byte("/api;jsessionid=1/v1/%69tems//42/./x/..?x=1")
	var buf []byte
	for b.Loop() {
		matchPath(nil, normal)
		buf = matchPath(buf[:0], odd)
	}
}

// TestUnmatchableRules: a rule whose host or path prefix is not in the
// form requests are matched as is reported (it would match nothing).
func TestUnmatchableRules(t *testing.T) {
	for _, tc := range []struct {
		host, path string
		bad        bool
	}{
		{"shop.example", "", false},
		{"Shop.Example", "", false},
		{"", "/api/", false},
		{"", "/ap", false},
		{"", "/api/.w", false},
		{"", "/api/..x", false},
		{"shop.example:8080", "", true},
		{"shop.example.", "", true},
		{"", "api/", true},
		{"", "/api;x/", true},
		{"", "/%61pi/", true},
		{"", "/a/../api/", true},
		{"", "//api/", true},
		{"", "/api/x;", true},
		{"", `/api\`, true},
	} {
		why := unmatchable(admission.Match{Host: tc.host, PathPrefix: tc.path})
		if (why != "") != tc.bad {
			t.Errorf("host %q path %q: %q, want bad=%v", tc.host, tc.path, why, tc.bad)
		}
	}
}

// FuzzMatchPath: for any target, the normal form starts with '/', has no
// empty or dot-segment, no ';' or '\', and is its own normal form (unless
// decoding made a '%' or a '?').
func FuzzMatchPath(f *testing.F) {
	for _, tc := range ruleSpellings {
		f.Add(tc.target)
	}
	f.Fuzz(func(t *testing.T, target string) {
		if len(target) == 0 || target[0] != '/' {
			return
		}
		got := string(matchPath(nil, []byte(target)))
		if got == "" || got[0] != '/' || strings.Contains(got, "//") {
			t.Fatalf("matchPath(%q) = %q", target, got)
		}
		for _, seg := range strings.Split(got[1:], "/") {
			if seg == "." || seg == ".." || strings.ContainsAny(seg, ";\\") {
				t.Fatalf("matchPath(%q) = %q: segment %q", target, got, seg)
			}
		}
		if !strings.Contains(got, "%") {
			if again := string(matchPath(nil, []byte(got))); again != got && !strings.Contains(got, "?") {
				t.Fatalf("matchPath(%q) = %q, then %q", target, got, again)
			}
		}
	})
}
